package numa

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestLockThread(t *testing.T) {
	runtime.LockOSThread() // keep this goroutine's thread so its mask can be compared
	defer runtime.UnlockOSThread()
	before, err := ThreadAffinity()
	if err != nil || len(before) == 0 {
		t.Fatalf("ThreadAffinity: %v, %v", before, err)
	}
	one := before[len(before)-1:]
	unlock, err := LockThread(one)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ThreadAffinity(); err != nil || !slices.Equal(got, one) {
		t.Errorf("after LockThread(%v): %v, %v", one, got, err)
	}
	unlock()
	if got, err := ThreadAffinity(); err != nil || !slices.Equal(got, before) {
		t.Errorf("after unlock: %v, %v; want %v", got, err, before)
	}
	if _, err := LockThread(nil); err == nil {
		t.Error("LockThread(no CPUs) succeeded")
	}
}

func TestSetProcessAffinity(t *testing.T) {
	before, err := threadAffinity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	one := before[:1]
	if err := SetProcessAffinity(one); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := SetProcessAffinity(before); err != nil {
			t.Errorf("restoring CPUs %s: %v", FormatCPUList(before), err)
		}
	}()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		got, err := threadAffinity(tid)
		if err != nil {
			continue // exited meanwhile
		}
		if !slices.Equal(got, one) {
			t.Errorf("thread %d on CPUs %s after SetProcessAffinity(%v)", tid, FormatCPUList(got), one)
		}
	}
	// A thread started afterwards inherits the mask.
	done := make(chan []int)
	go func() {
		runtime.LockOSThread() // a locked goroutine that exits takes its thread along
		got, _ := ThreadAffinity()
		done <- got
	}()
	if got := <-done; !slices.Equal(got, one) {
		t.Errorf("a later thread runs on CPUs %v", got)
	}
}

// mempolicyOf returns the policy mode and node mask governing the page at addr.
func mempolicyOf(t *testing.T, addr uintptr) (int, uint64) {
	t.Helper()
	const mpolFAddr = 2 // MPOL_F_ADDR
	var mode int32
	var mask [16]uint64
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&mode)), uintptr(unsafe.Pointer(&mask[0])),
		uintptr(len(mask)*64), addr, mpolFAddr, 0)
	if e != 0 {
		t.Fatalf("get_mempolicy: %v", e)
	}
	return int(mode), mask[0]
}

func TestBind(t *testing.T) {
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	err = Bind(mem, 0)
	if errors.Is(err, ErrNotPermitted) {
		// Refused here (a container without CAP_SYS_NICE): the error must say so.
		if !strings.Contains(err.Error(), "node 0") || !strings.Contains(err.Error(), "CAP_SYS_NICE") {
			t.Errorf("refusal lacks the node or the hint: %v", err)
		}
	} else if err != nil {
		t.Fatalf("Bind to node 0: %v", err)
	} else {
		mode, mask := mempolicyOf(t, uintptr(unsafe.Pointer(&mem[page])))
		if mode != mpolPreferred || mask != 1 {
			t.Errorf("after Bind to node 0: policy %d mask %#x, want MPOL_PREFERRED (1) on node 0", mode, mask)
		}
	}
	if err := Bind(mem, 1023); err == nil || !strings.Contains(err.Error(), "node 1023") {
		t.Errorf("Bind to node 1023: %v, want an error naming the node", err)
	}
	if err := Bind(mem, -1); err == nil {
		t.Error("Bind to node -1 succeeded")
	}
	if err := Bind(mem[1:], 0); err == nil || !strings.Contains(err.Error(), "not page aligned") {
		t.Errorf("Bind of unaligned memory: %v", err)
	}
	if err := Bind(nil, 0); err != nil {
		t.Errorf("Bind(nil): %v", err)
	}
}
