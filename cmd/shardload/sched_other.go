//go:build !linux

package main

import "errors"

// setBatchPolicy is Linux only.
func setBatchPolicy() error { return errors.New("SCHED_BATCH is Linux only") }
