// Package device is the last stage of the pipeline: it hands each collated batch to
// the device that computes on it, overlapping that transfer with the trainer's step.
//
// Two backends:
//
//   - host: no device. The batch stays in its pinned slab, where a trainer reads it
//     (or copies it itself); the stage still counts batches and bytes and times how
//     long consumers waited, so a pipeline reports the same figures either way.
//   - cuda: an NVIDIA GPU through the CUDA driver API. The driver library
//     (libcuda.so.1) is loaded when the stage is opened (dlopen through a small cgo
//     shim), so building needs no CUDA SDK and a binary runs on machines without a
//     GPU. The stage registers the slabs as pinned memory (cuMemHostRegister),
//     allocates Options.Buffers device buffers (2 by default: double buffering),
//     and copies each batch into a free buffer on that buffer's own stream
//     (cuMemcpyHtoDAsync), between two events. Copy returns at once; the consumer
//     waits on the transfer's end event (Transfer.Wait) and hands the buffer back
//     with Transfer.Release. While the consumer computes on batch N in one buffer,
//     batch N+1 is copied into the other; Copy blocks while every buffer is held,
//     which is the stage's back-pressure.
//
// Kind auto picks cuda when a driver and a GPU are there and host otherwise, saying
// so in one line through Options.Logf. Kind cuda without them fails with an error
// wrapping ErrNoDriver that says what was missing.
//
// # Why a cgo shim and not a no-cgo loader
//
// Every CUDA call goes through one C function of the shim that makes the stage's
// context current on the calling thread and then calls the driver. A CUDA context is
// per OS thread and goroutines move between threads, so the two must happen in one
// C call; the C compiler also checks each call against the driver's prototypes
// (64-bit CUdeviceptr, size_t lengths, int results), where a no-cgo loader would
// pass whatever the Go declaration says. Blocking calls (cuEventSynchronize) run as
// ordinary cgo calls: the Go scheduler hands the processor to other goroutines. A
// build with CGO_ENABLED=0 still compiles; its cuda backend reports that it was
// built without cgo.
//
// # Timing
//
// Stats.CopyTime sums the time between each copy's two events, as the GPU measured
// it: the copy engine's time, from which Stats.GBPerSec is the host-to-device rate.
// Stats.WaitTime sums the time consumers spent in Transfer.Wait. When copies overlap
// the consumer's compute, consumers barely wait: Stats.Overlap is the share of copy
// time they did not wait for.
package device
