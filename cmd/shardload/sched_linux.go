package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// setBatchPolicy puts every thread of this process under SCHED_BATCH, the policy
// for CPU-bound work that should not preempt others when they wake: a trainer
// woken on a CPU where the loader's threads run gets the CPU at once, instead of
// after the loader's burst of work (its release of a slab wakes the loader). Threads
// the Go runtime creates later inherit the policy from the thread that creates them.
// No privilege is needed.
func setBatchPolicy() error {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("listing this process's threads: %w", err)
	}
	var errs []error
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		attr := unix.SchedAttr{Policy: unix.SCHED_BATCH}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	return errors.Join(errs...)
}
