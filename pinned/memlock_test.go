//go:build linux

package pinned

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary, re-executed by TestRealMemlockLimit, run
// memlockChild instead of the tests.
const childEnv = "PINNED_TEST_MEMLOCK_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(memlockChild(mode))
	}
	os.Exit(m.Run())
}

// hooks replaces the package's seams for one test.
func hooks(t *testing.T, limit func() (uint64, error), exceed func() bool, lock func([]byte) error) {
	t.Helper()
	oldLimit, oldExceed, oldLock := memlockLimit, canExceedMemlock, mlock
	t.Cleanup(func() { memlockLimit, canExceedMemlock, mlock = oldLimit, oldExceed, oldLock })
	if limit != nil {
		memlockLimit = limit
	}
	if exceed != nil {
		canExceedMemlock = exceed
	}
	if lock != nil {
		mlock = lock
	}
}

func TestLocked(t *testing.T) {
	limit, err := softMemlockLimit()
	if err != nil {
		t.Fatal(err)
	}
	hasCap := hasCapIPCLock()
	t.Logf("RLIMIT_MEMLOCK soft limit %d bytes, CAP_IPC_LOCK %v", limit, hasCap)
	tests := []struct {
		name  string
		slabs int
	}{
		{"within limit", 1},
		{"beyond limit", int(limit/(2*mib)) + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total := uint64(tt.slabs) * 2 * mib
			if total > 512*mib {
				t.Skipf("RLIMIT_MEMLOCK %d is too high to exceed cheaply", limit)
			}
			want := hasCap || total <= limit
			base := vmLockedKiB(t)
			var warnings []string
			r, err := NewRing(Options{Slabs: tt.slabs, SlabBytes: 2 * mib, Warn: func(m string) { warnings = append(warnings, m) }})
			if err != nil {
				t.Fatal(err)
			}
			if r.Locked() != want {
				t.Errorf("Locked() = %v, want %v (%d bytes, limit %d, CAP_IPC_LOCK %v)", r.Locked(), want, total, limit, hasCap)
			}
			if want && len(warnings) != 0 || !want && len(warnings) != 1 {
				t.Errorf("warnings %q with Locked() %v", warnings, r.Locked())
			}
			wantKiB := base
			if want {
				wantKiB += total / 1024
			}
			if got := vmLockedKiB(t); got != wantKiB {
				t.Errorf("VmLck %d kB, want %d", got, wantKiB)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if got := vmLockedKiB(t); got != base {
				t.Errorf("VmLck %d kB after Close, want %d", got, base)
			}
		})
	}
}

// TestMemlockFallback drives the locking decision through the seams, so the paths a
// non-root process takes are tested even as root.
func TestMemlockFallback(t *testing.T) {
	const n, size = 2, 1 * mib
	fixed := func(v uint64) func() (uint64, error) { return func() (uint64, error) { return v, nil } }
	unreadable := func() (uint64, error) { return 0, unix.EPERM }
	common := []string{"cannot lock 2 MiB (2097152 bytes) in memory (2 slabs of 1 MiB)", "RLIMIT_MEMLOCK",
		"LimitMEMLOCK=", "--ulimit memlock=-1", "CAP_IPC_LOCK", "unpinned"}
	tests := []struct {
		name      string
		limit     func() (uint64, error)
		canExceed bool
		failAt    int // mlock call that fails, -1 for none
		failErr   error
		locked    bool
		mlocks    int      // mlock calls expected
		warn      []string // substrings of the one warning; nil for none
	}{
		{"below limit, no CAP_IPC_LOCK", fixed(1 * mib), false, -1, nil, false, 0,
			append([]string{"1 MiB (1048576 bytes)", "lacks CAP_IPC_LOCK"}, common...)},
		{"below limit, CAP_IPC_LOCK", fixed(1 * mib), true, -1, nil, true, n, nil},
		{"exactly the limit", fixed(2 * mib), false, -1, nil, true, n, nil},
		{"unlimited", fixed(unix.RLIM_INFINITY), false, -1, nil, true, n, nil},
		{"limit unreadable", unreadable, false, -1, nil, true, n, nil},
		{"second mlock EPERM", fixed(unix.RLIM_INFINITY), false, 1, unix.EPERM, false, 2,
			append([]string{"mlock: operation not permitted", "RLIMIT_MEMLOCK is unlimited"}, common...)},
		{"first mlock ENOMEM", fixed(64 * mib), false, 0, unix.ENOMEM, false, 1,
			append([]string{"mlock: cannot allocate memory", "64 MiB (67108864 bytes)"}, common...)},
		{"mlock EAGAIN, limit unreadable", unreadable, false, 1, unix.EAGAIN, false, 2,
			append([]string{"mlock: resource temporarily unavailable", "could not be read: operation not permitted"}, common...)},
		{"mlock other error", fixed(unix.RLIM_INFINITY), true, 1, unix.EIO, false, 2,
			append([]string{"mlock failed unexpectedly: input/output error"}, common...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			hooks(t, tt.limit, func() bool { return tt.canExceed }, func(b []byte) error {
				calls++
				if calls-1 == tt.failAt {
					return tt.failErr
				}
				return unix.Mlock(b)
			})
			base := vmLockedKiB(t)
			var warnings []string
			r := newTestRing(t, Options{Slabs: n, SlabBytes: size, NoHugePages: true,
				Warn: func(m string) { warnings = append(warnings, m) }})
			if r.Locked() != tt.locked {
				t.Errorf("Locked() = %v, want %v", r.Locked(), tt.locked)
			}
			if calls != tt.mlocks {
				t.Errorf("mlock called %d times, want %d", calls, tt.mlocks)
			}
			wantKiB := base
			if tt.locked {
				wantKiB += n * size / 1024
			}
			if got := vmLockedKiB(t); got != wantKiB {
				t.Errorf("VmLck %d kB, want %d (partial locks must be undone)", got, wantKiB)
			}
			switch {
			case tt.warn == nil && len(warnings) != 0:
				t.Errorf("unexpected warnings %q", warnings)
			case tt.warn != nil && len(warnings) != 1:
				t.Errorf("%d warnings %q, want exactly 1", len(warnings), warnings)
			case tt.warn != nil:
				w := warnings[0]
				// What the limit must allow: these slabs and whatever else is locked.
				need := uint64(2048)
				if tt.failAt >= 0 {
					need += base
				}
				if want := fmt.Sprintf("ulimit -l %d ", need); !strings.Contains(w, want) {
					t.Errorf("warning %q lacks %q", w, want)
				}
				if strings.Contains(w, "\n") {
					t.Errorf("warning is not one line: %q", w)
				}
				for _, sub := range tt.warn {
					if !strings.Contains(w, sub) {
						t.Errorf("warning %q lacks %q", w, sub)
					}
				}
			}
			// Locked or not, the slabs work.
			checkRing(t, r, n, size, DefaultName)
			s, err := r.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestDefaultWarn(t *testing.T) {
	hooks(t, func() (uint64, error) { return 64 << 10, nil }, func() bool { return false }, nil)
	var buf bytes.Buffer
	old := stderr
	stderr = &buf
	defer func() { stderr = old }()
	r, err := NewRing(Options{Slabs: 1, SlabBytes: 1, Warn: nil})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Locked() {
		t.Errorf("Locked() = true beyond the limit without CAP_IPC_LOCK")
	}
	out := buf.String()
	if !strings.HasPrefix(out, "shardload: warning: pinned: cannot lock 2 MiB (2097152 bytes) in memory (1 slab of 2 MiB)") ||
		strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") ||
		!strings.Contains(out, "RLIMIT_MEMLOCK is 64 KiB (65536 bytes)") {
		t.Errorf("default warning output %q", out)
	}
	t.Log(strings.TrimSpace(out))
}

func TestNoLock(t *testing.T) {
	hooks(t, func() (uint64, error) { return 0, nil }, func() bool { return false }, func([]byte) error {
		t.Error("mlock called with NoLock")
		return nil
	})
	base := vmLockedKiB(t)
	r := newTestRing(t, Options{Slabs: 2, SlabBytes: 4 * page, NoHugePages: true, NoLock: true})
	if r.Locked() {
		t.Error("Locked() = true with NoLock")
	}
	if got := vmLockedKiB(t); got != base {
		t.Errorf("VmLck %d kB with NoLock, want %d", got, base)
	}
	checkRing(t, r, 2, 4*page, DefaultName)
}

// childResult is what memlockChild reports on stdout.
type childResult struct {
	Err      string
	HasCap   bool
	Limit    uint64
	Base     uint64 // VmLck, kB, before any ring
	Locked   bool
	Warnings []string
	AfterKiB uint64 // VmLck after the ring beyond the limit
	// Only with the capability dropped: ring A fits the limit, ring B's second slab
	// does not once A is locked.
	LockedA, LockedB bool
	WarningsA        []string
	WarningsB        []string
	AKiB, BKiB       uint64 // VmLck after A, after B
}

// memlockChild runs in a re-executed test binary under a real RLIMIT_MEMLOCK of
// 1 MiB. With mode "drop-cap" it first drops CAP_IPC_LOCK from its thread, the one
// that makes the rings (capabilities are per thread; the goroutine is locked to it).
func memlockChild(mode string) int {
	runtime.LockOSThread()
	res := childResult{}
	out := func() int {
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	var old unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_MEMLOCK, nil, &old); err != nil {
		res.Err = "prlimit: " + err.Error()
		return out()
	}
	if old.Max < mib {
		res.Err = fmt.Sprintf("hard RLIMIT_MEMLOCK %d below 1 MiB", old.Max)
		return out()
	}
	if err := unix.Prlimit(0, unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: mib, Max: old.Max}, nil); err != nil {
		res.Err = "prlimit: " + err.Error()
		return out()
	}
	if mode == "drop-cap" {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			res.Err = "capget: " + err.Error()
			return out()
		}
		data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			res.Err = "capset: " + err.Error()
			return out()
		}
	}
	res.HasCap = hasCapIPCLock()
	res.Limit, _ = softMemlockLimit()
	var err error
	if res.Base, err = lockedKiB(); err != nil {
		res.Err = err.Error()
		return out()
	}
	usable := func(r *Ring) error {
		for _, s := range r.Slabs() {
			b := s.Bytes()
			b[0], b[len(b)-1] = 0x5A, 0xA5
			got := make([]byte, 1)
			if _, err := unix.Pread(s.FD(), got, int64(len(b)-1)); err != nil || got[0] != 0xA5 {
				return fmt.Errorf("slab %d unusable: %v %#x", s.Index(), err, got)
			}
		}
		return nil
	}
	mk := func(slabs int, size int64, warnings *[]string, kib *uint64) (*Ring, bool) {
		r, err := NewRing(Options{Slabs: slabs, SlabBytes: size, NoHugePages: true,
			Warn: func(m string) { *warnings = append(*warnings, m) }})
		if err == nil {
			err = usable(r)
		}
		if err == nil {
			*kib, err = lockedKiB()
		}
		if err != nil {
			res.Err = err.Error()
			return nil, false
		}
		return r, true
	}
	r, ok := mk(2, mib, &res.Warnings, &res.AfterKiB)
	if !ok {
		return out()
	}
	res.Locked = r.Locked()
	r.Close()
	if mode == "drop-cap" {
		a, ok := mk(1, 512<<10, &res.WarningsA, &res.AKiB)
		if !ok {
			return out()
		}
		b, ok := mk(2, 384<<10, &res.WarningsB, &res.BKiB)
		if !ok {
			return out()
		}
		res.LockedA, res.LockedB = a.Locked(), b.Locked()
		a.Close()
		b.Close()
	}
	return out()
}

// TestRealMemlockLimit runs rings in a subprocess under a real RLIMIT_MEMLOCK of
// 1 MiB. Root has CAP_IPC_LOCK, which lets mlock exceed the limit, so with the
// capability kept the 2 MiB ring is locked as root (and not otherwise); with it
// dropped the kernel refuses and the fallback runs for real, including undoing a
// partial lock when memory locked by an earlier ring pushes a later one over.
func TestRealMemlockLimit(t *testing.T) {
	for _, mode := range []string{"keep-cap", "drop-cap"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+mode)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var res childResult
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("child output %q: %v", out, err)
			}
			t.Logf("child: %+v", res)
			if strings.HasPrefix(res.Err, "capset") || strings.HasPrefix(res.Err, "hard RLIMIT_MEMLOCK") {
				t.Skip(res.Err)
			}
			if res.Err != "" {
				t.Fatal(res.Err)
			}
			if res.Limit != mib {
				t.Fatalf("child limit %d, want %d", res.Limit, mib)
			}
			wantCap := mode == "keep-cap" && hasCapIPCLock()
			if res.HasCap != wantCap {
				t.Fatalf("child CAP_IPC_LOCK %v, want %v", res.HasCap, wantCap)
			}
			if res.Locked != res.HasCap {
				t.Errorf("2 MiB ring under a 1 MiB limit: Locked %v with CAP_IPC_LOCK %v", res.Locked, res.HasCap)
			}
			wantKiB := res.Base
			if res.Locked {
				wantKiB += 2048
				if len(res.Warnings) != 0 {
					t.Errorf("warnings %q though locked", res.Warnings)
				}
			} else if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "RLIMIT_MEMLOCK is 1 MiB (1048576 bytes)") ||
				!strings.Contains(res.Warnings[0], "2 MiB (2097152 bytes)") || !strings.Contains(res.Warnings[0], "ulimit -l 2048 ") {
				t.Errorf("warnings %q, want one naming the 1 MiB limit and 2 MiB needed", res.Warnings)
			}
			if res.AfterKiB != wantKiB {
				t.Errorf("VmLck %d kB with the ring, want %d", res.AfterKiB, wantKiB)
			}
			if mode != "drop-cap" {
				return
			}
			if !res.LockedA || len(res.WarningsA) != 0 || res.AKiB != res.Base+512 {
				t.Errorf("ring A (512 KiB, fits): Locked %v, warnings %q, VmLck %d kB, want true, none, %d",
					res.LockedA, res.WarningsA, res.AKiB, res.Base+512)
			}
			if res.LockedB || len(res.WarningsB) != 1 || !strings.Contains(res.WarningsB[0], "mlock: cannot allocate memory") ||
				!strings.Contains(res.WarningsB[0], "has 512 KiB locked already") || !strings.Contains(res.WarningsB[0], "ulimit -l 1280 ") {
				t.Errorf("ring B (768 KiB, over with A): Locked %v, warnings %q; want false and one mlock warning asking for 1280 KiB",
					res.LockedB, res.WarningsB)
			}
			if res.BKiB != res.AKiB {
				t.Errorf("VmLck %d kB after ring B, want %d: its first slab's lock must be undone", res.BKiB, res.AKiB)
			}
		})
	}
}
