// Package mem holds the memory mechanisms several stages share, each defined once:
// the huge page size buffers are aligned to, faulting a buffer's pages in with one
// call, and mapping huge-page-aligned chunks for buffer arenas; and byte sizes as
// flags and messages write them.
package mem

import (
	"fmt"
	"strconv"
	"strings"
)

// HugePage is the size of a transparent huge page that buffers are aligned and
// rounded to: the x86-64 (and 4 KiB-page arm64) PMD size.
const HugePage = 2 << 20

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1e3, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1e6, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1e9, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1e12, "tib": 1 << 40,
}

// ParseSize parses a byte count with an optional unit: 512, 64KiB, 8MB, 1GiB, 2G (k,
// m, g, t alone are binary), fractions allowed (1.5GiB).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := sizeUnits[unit]
	f, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512, 64KiB, 8MB, 1GiB)", s)
	}
	return int64(f * float64(mult)), nil
}

// FormatSize writes n in the largest binary unit that divides it: 512B, 64KiB, 1GiB,
// 1.5GiB is 1536MiB.
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 && n%1024 == 0 {
		f /= 1024
		n /= 1024
		i++
	}
	return strconv.FormatFloat(f, 'f', -1, 64) + units[i]
}
