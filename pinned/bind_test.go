//go:build linux

package pinned

import (
	"errors"
	"strings"
	"testing"
	"unsafe"
)

func TestBindHook(t *testing.T) {
	var seen [][]byte
	var resident []int
	r := newTestRing(t, Options{Slabs: 3, SlabBytes: 4 * page, NoHugePages: true, NoLock: true,
		Bind: func(mem []byte) error {
			seen = append(seen, mem)
			// Called before the pages are faulted in, so binding decides where they go.
			vec := make([]byte, len(mem)/int(page))
			if err := mincore(mem, vec); err != nil {
				t.Errorf("mincore: %v", err)
			}
			n := 0
			for _, v := range vec {
				n += int(v & 1)
			}
			resident = append(resident, n)
			return nil
		}})
	if !r.Bound() {
		t.Error("Bound() = false after a Bind that succeeded")
	}
	if len(seen) != 3 {
		t.Fatalf("Bind called %d times, want once per slab (3)", len(seen))
	}
	for i, s := range r.Slabs() {
		if unsafe.SliceData(seen[i]) != unsafe.SliceData(s.Bytes()) || len(seen[i]) != len(s.Bytes()) {
			t.Errorf("Bind call %d got other memory than slab %d", i, i)
		}
		if resident[i] != 0 {
			t.Errorf("slab %d had %d pages resident when Bind was called, want 0", i, resident[i])
		}
	}
	checkRing(t, r, 3, 4*page, DefaultName)
}

func TestBindFailureWarnsOnce(t *testing.T) {
	calls := 0
	var warnings []string
	r := newTestRing(t, Options{Slabs: 3, SlabBytes: 2 * page, NoHugePages: true, NoLock: true,
		Bind: func([]byte) error { calls++; return errors.New("mbind: operation not permitted") },
		Warn: func(msg string) { warnings = append(warnings, msg) }})
	if r.Bound() {
		t.Error("Bound() = true after Bind failed")
	}
	if calls != 1 {
		t.Errorf("Bind called %d times after failing, want 1", calls)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "slab 0 of 3 not bound: mbind: operation not permitted") {
		t.Errorf("warnings = %q", warnings)
	}
	checkRing(t, r, 3, 2*page, DefaultName)
	if r2 := newTestRing(t, small(1, 1)); r2.Bound() {
		t.Error("Bound() = true without Bind")
	}
}
