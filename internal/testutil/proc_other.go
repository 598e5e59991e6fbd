//go:build !linux

package testutil

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
