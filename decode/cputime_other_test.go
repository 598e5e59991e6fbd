//go:build !unix

package decode

import "time"

// cpuTime returns 0: the benchmarks' cpu-ms/op is measured on Unix only.
func cpuTime() time.Duration { return 0 }
