package testutil

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the server if the test binary dies without
// cleaning up (a panic, a timeout, a signal).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
