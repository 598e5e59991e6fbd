package numa

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxCPU bounds the CPU numbers ParseCPUList accepts (Linux's NR_CPUS is at most
// 8192 today), so that a hostile list cannot make it allocate without bound.
const MaxCPU = 1 << 16

// ParseCPUList parses the kernel's CPU list format ("0-3,8-11", "0,2", "0-31:2/8"
// is not used by sysfs and is refused; an empty or blank list is no CPUs) into
// ascending, distinct CPU numbers.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrCPUList, s, err)
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return nil, fmt.Errorf("%w %q: %v", ErrCPUList, s, err)
			}
			if b < a {
				return nil, fmt.Errorf("%w %q: range %d-%d runs backwards", ErrCPUList, s, a, b)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
		if len(cpus) > MaxCPU {
			return nil, fmt.Errorf("%w %q: more than %d CPUs", ErrCPUList, s, MaxCPU)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

func cpuNumber(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a CPU number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n >= MaxCPU {
		return 0, fmt.Errorf("CPU %s is beyond the limit of %d", s, MaxCPU-1)
	}
	return n, nil
}

// FormatCPUList writes CPUs in the kernel's list format, runs as ranges:
// [0 1 2 3 8 9] is "0-3,8-9". The input need not be sorted; duplicates are dropped.
func FormatCPUList(cpus []int) string {
	c := slices.Compact(slices.Sorted(slices.Values(cpus)))
	var b strings.Builder
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(c[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(c[j]))
		}
		i = j + 1
	}
	return b.String()
}
