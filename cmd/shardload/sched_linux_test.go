package main

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// After setBatchPolicy, the threads the process has and the ones the runtime
// starts afterwards run under SCHED_BATCH.
func TestSetBatchPolicy(t *testing.T) {
	if err := setBatchPolicy(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	// Force new threads: more goroutines locked to their threads, all alive at
	// once, than the process has threads.
	var started, done sync.WaitGroup
	release := make(chan struct{})
	for range len(before) + 4 {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) <= len(before) {
		t.Fatalf("%d threads after locking %d goroutines, %d before: no new thread to check", len(ents), len(before)+4, len(before))
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // the thread ended
		}
		if attr.Policy != unix.SCHED_BATCH {
			t.Errorf("thread %d: policy %d, want SCHED_BATCH (%d)", tid, attr.Policy, unix.SCHED_BATCH)
		}
	}
	close(release)
	done.Wait()
}
