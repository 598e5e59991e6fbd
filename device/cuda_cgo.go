//go:build linux && cgo

package device

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The few CUDA driver API types used, as cuda.h declares them on 64-bit Linux.
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
	SL_ALREADY_REGISTERED = 712,     // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
	SL_STREAM_NON_BLOCKING = 0x1,    // CU_STREAM_NON_BLOCKING
	SL_EVENT_BLOCKING_SYNC = 0x1,    // CU_EVENT_BLOCKING_SYNC: wait without spinning
	SL_MEMHOSTREGISTER_PORTABLE = 0x1 // CU_MEMHOSTREGISTER_PORTABLE
};

// sl_cuda is one loaded driver library and the context of one GPU.
typedef struct {
	void *lib;
	CUdevice dev;
	CUcontext ctx;
	CUresult (*Init)(unsigned int);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemHostRegister)(void *, size_t, unsigned int);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*GetErrorString)(CUresult, const char **);
	CUresult (*GetErrorName)(CUresult, const char **);
} sl_cuda;

// sl_sym finds a function by its versioned name (what cuda.h maps calls to) or,
// failing that, its plain name. It records the first name missing.
static void *sl_sym(sl_cuda *c, const char *v2, const char *plain, const char **missing) {
	void *p = v2 ? dlsym(c->lib, v2) : NULL;
	if (!p) p = dlsym(c->lib, plain);
	if (!p && !*missing) *missing = plain;
	return p;
}

// sl_open loads path and resolves every function. On failure it returns NULL and sets
// *why to dlerror's text or the missing function's name (static strings).
static sl_cuda *sl_open(const char *path, const char **why) {
	sl_cuda *c = calloc(1, sizeof *c);
	if (!c) { *why = "out of memory"; return NULL; }
	c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!c->lib) { *why = dlerror(); free(c); return NULL; }
	const char *m = NULL;
	c->Init = sl_sym(c, NULL, "cuInit", &m);
	c->DeviceGetCount = sl_sym(c, NULL, "cuDeviceGetCount", &m);
	c->DeviceGet = sl_sym(c, NULL, "cuDeviceGet", &m);
	c->DeviceGetName = sl_sym(c, NULL, "cuDeviceGetName", &m);
	c->DeviceGetPCIBusId = sl_sym(c, NULL, "cuDeviceGetPCIBusId", &m);
	c->DevicePrimaryCtxRetain = sl_sym(c, NULL, "cuDevicePrimaryCtxRetain", &m);
	c->DevicePrimaryCtxRelease = sl_sym(c, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", &m);
	c->CtxSetCurrent = sl_sym(c, NULL, "cuCtxSetCurrent", &m);
	c->MemAlloc = sl_sym(c, "cuMemAlloc_v2", "cuMemAlloc", &m);
	c->MemFree = sl_sym(c, "cuMemFree_v2", "cuMemFree", &m);
	c->MemHostRegister = sl_sym(c, "cuMemHostRegister_v2", "cuMemHostRegister", &m);
	c->MemHostUnregister = sl_sym(c, NULL, "cuMemHostUnregister", &m);
	c->StreamCreate = sl_sym(c, NULL, "cuStreamCreate", &m);
	c->StreamDestroy = sl_sym(c, "cuStreamDestroy_v2", "cuStreamDestroy", &m);
	c->EventCreate = sl_sym(c, NULL, "cuEventCreate", &m);
	c->EventDestroy = sl_sym(c, "cuEventDestroy_v2", "cuEventDestroy", &m);
	c->EventRecord = sl_sym(c, NULL, "cuEventRecord", &m);
	c->EventSynchronize = sl_sym(c, NULL, "cuEventSynchronize", &m);
	c->EventElapsedTime = sl_sym(c, NULL, "cuEventElapsedTime", &m);
	c->MemcpyHtoDAsync = sl_sym(c, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", &m);
	c->MemcpyDtoH = sl_sym(c, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", &m);
	c->GetErrorString = sl_sym(c, NULL, "cuGetErrorString", &m);
	c->GetErrorName = sl_sym(c, NULL, "cuGetErrorName", &m);
	if (m) { *why = m; dlclose(c->lib); free(c); return NULL; }
	return c;
}

static void sl_close(sl_cuda *c) { dlclose(c->lib); free(c); }

static const char *sl_error_string(sl_cuda *c, CUresult r) {
	const char *s = NULL;
	if (c->GetErrorString(r, &s) != 0 || !s) return "unknown CUDA error";
	return s;
}

static const char *sl_error_name(sl_cuda *c, CUresult r) {
	const char *s = NULL;
	if (c->GetErrorName(r, &s) != 0 || !s) return "CUDA_ERROR_UNKNOWN";
	return s;
}

// sl_init initialises the driver and counts the GPUs.
static CUresult sl_init(sl_cuda *c, int *count) {
	CUresult r = c->Init(0);
	if (r) return r;
	return c->DeviceGetCount(count);
}

// sl_device retains GPU ordinal's primary context (the one the CUDA runtime and
// PyTorch share) and reads its name and PCI address.
static CUresult sl_device(sl_cuda *c, int ordinal, char *name, int nlen, char *pci, int plen) {
	CUresult r = c->DeviceGet(&c->dev, ordinal);
	if (r) return r;
	if ((r = c->DeviceGetName(name, nlen, c->dev))) return r;
	if ((r = c->DeviceGetPCIBusId(pci, plen, c->dev))) return r;
	return c->DevicePrimaryCtxRetain(&c->ctx, c->dev);
}

// Every call below first makes the GPU's context current on this thread: goroutines
// move between threads, so it cannot be set once.
#define SL_CURRENT(c) do { CUresult r_ = (c)->CtxSetCurrent((c)->ctx); if (r_) return r_; } while (0)

static CUresult sl_release(sl_cuda *c) { return c->DevicePrimaryCtxRelease(c->dev); }

static CUresult sl_alloc(sl_cuda *c, size_t n, CUdeviceptr *p) { SL_CURRENT(c); return c->MemAlloc(p, n); }
static CUresult sl_free(sl_cuda *c, CUdeviceptr p) { SL_CURRENT(c); return c->MemFree(p); }

static CUresult sl_register(sl_cuda *c, void *p, size_t n) {
	SL_CURRENT(c);
	CUresult r = c->MemHostRegister(p, n, SL_MEMHOSTREGISTER_PORTABLE);
	return r == SL_ALREADY_REGISTERED ? 0 : r;
}
static CUresult sl_unregister(sl_cuda *c, void *p) { SL_CURRENT(c); return c->MemHostUnregister(p); }

static CUresult sl_lane(sl_cuda *c, CUstream *s, CUevent *start, CUevent *end) {
	SL_CURRENT(c);
	CUresult r = c->StreamCreate(s, SL_STREAM_NON_BLOCKING);
	if (r) return r;
	if ((r = c->EventCreate(start, 0))) return r;
	return c->EventCreate(end, SL_EVENT_BLOCKING_SYNC);
}

static CUresult sl_lane_destroy(sl_cuda *c, CUstream s, CUevent start, CUevent end) {
	SL_CURRENT(c);
	CUresult r1 = end ? c->EventDestroy(end) : 0;
	CUresult r2 = start ? c->EventDestroy(start) : 0;
	CUresult r3 = s ? c->StreamDestroy(s) : 0;
	return r1 ? r1 : r2 ? r2 : r3;
}

// sl_copy enqueues start event, the copy and end event on the lane's stream.
static CUresult sl_copy(sl_cuda *c, CUstream s, CUevent start, CUevent end, CUdeviceptr dst, const void *src, size_t n) {
	SL_CURRENT(c);
	CUresult r = c->EventRecord(start, s);
	if (r) return r;
	if ((r = c->MemcpyHtoDAsync(dst, src, n, s))) return r;
	return c->EventRecord(end, s);
}

static CUresult sl_wait(sl_cuda *c, CUevent end) { SL_CURRENT(c); return c->EventSynchronize(end); }

static CUresult sl_elapsed(sl_cuda *c, CUevent start, CUevent end, float *ms) {
	SL_CURRENT(c);
	return c->EventElapsedTime(ms, start, end);
}

static CUresult sl_read_back(sl_cuda *c, void *dst, CUdeviceptr src, size_t n) {
	SL_CURRENT(c);
	return c->MemcpyDtoH(dst, src, n);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// cudaDriver is a loaded libcuda and one GPU's primary context.
type cudaDriver struct {
	c    *C.sl_cuda
	desc string
	pci  string
}

var _ driver = (*cudaDriver)(nil)
var _ lane = (*cudaLane)(nil)

// openDriver loads the library and opens GPU ordinal. Every way of finding no usable
// GPU wraps ErrNoDriver.
func openDriver(library string, ordinal int) (driver, error) {
	cpath := C.CString(library)
	defer C.free(unsafe.Pointer(cpath))
	var why *C.char
	c := C.sl_open(cpath, &why)
	if c == nil {
		return nil, fmt.Errorf("%w: loading %s: %s (install the NVIDIA driver, or use --device host)", ErrNoDriver, library, C.GoString(why))
	}
	d := &cudaDriver{c: c}
	var count C.int
	if r := C.sl_init(c, &count); r != 0 {
		// CUDA_ERROR_NO_DEVICE, or a driver that does not match its kernel module.
		err := d.err("cuInit", r)
		C.sl_close(c)
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDriver, library, err)
	}
	if ordinal >= int(count) {
		C.sl_close(c)
		return nil, fmt.Errorf("%w: GPU %d asked for, the driver (%s) sees %d (CUDA_VISIBLE_DEVICES applies)", ErrNoDriver, ordinal, library, count)
	}
	var name [256]C.char
	var pci [64]C.char
	if r := C.sl_device(c, C.int(ordinal), &name[0], C.int(len(name)), &pci[0], C.int(len(pci))); r != 0 {
		err := d.err(fmt.Sprintf("opening GPU %d", ordinal), r)
		C.sl_close(c)
		return nil, err
	}
	d.pci = C.GoString(&pci[0])
	d.desc = C.GoString(&name[0]) + ", PCI " + d.pci
	return d, nil
}

// err turns a CUDA result into an error naming the call: "cuMemAlloc:
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
func (d *cudaDriver) err(op string, r C.CUresult) error {
	return fmt.Errorf("%w: %s: %s (%s, code %d)", ErrCUDA, op, C.GoString(C.sl_error_name(d.c, r)),
		C.GoString(C.sl_error_string(d.c, r)), int(r))
}

func (d *cudaDriver) describe() string { return d.desc }
func (d *cudaDriver) pciBusID() string { return d.pci }

func (d *cudaDriver) alloc(n int64) (uint64, error) {
	var p C.CUdeviceptr
	if r := C.sl_alloc(d.c, C.size_t(n), &p); r != 0 {
		return 0, d.err(fmt.Sprintf("cuMemAlloc(%d bytes)", n), r)
	}
	return uint64(p), nil
}

func (d *cudaDriver) free(p uint64) error {
	if p == 0 {
		return nil
	}
	if r := C.sl_free(d.c, C.CUdeviceptr(p)); r != 0 {
		return d.err("cuMemFree", r)
	}
	return nil
}

// register and unregister take memory that is not Go's (mmap'd slabs); the driver
// keeps the address, which cgo allows only for memory the Go collector does not own.
func (d *cudaDriver) register(mem []byte) error {
	if r := C.sl_register(d.c, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem))); r != 0 {
		return d.err("cuMemHostRegister", r)
	}
	return nil
}

func (d *cudaDriver) unregister(mem []byte) error {
	if r := C.sl_unregister(d.c, unsafe.Pointer(unsafe.SliceData(mem))); r != 0 {
		return d.err("cuMemHostUnregister", r)
	}
	return nil
}

func (d *cudaDriver) newLane() (lane, error) {
	l := &cudaLane{d: d}
	if r := C.sl_lane(d.c, &l.stream, &l.start, &l.end); r != 0 {
		err := d.err("cuStreamCreate/cuEventCreate", r)
		_ = l.destroy()
		return nil, err
	}
	return l, nil
}

func (d *cudaDriver) close() error {
	var err error
	if r := C.sl_release(d.c); r != 0 {
		err = d.err("cuDevicePrimaryCtxRelease", r)
	}
	C.sl_close(d.c)
	return err
}

// cudaLane is a stream with its start and end events.
type cudaLane struct {
	d          *cudaDriver
	stream     C.CUstream
	start, end C.CUevent
}

// copy passes src's address to the driver, which reads it after the call returns.
// src is pinned host memory outside the Go heap (a slab), or, for tests, memory the
// caller keeps alive and unchanged until wait returns.
func (l *cudaLane) copy(dst uint64, src []byte) error {
	if len(src) == 0 {
		src = make([]byte, 1)[:0] // a valid address for a zero-byte copy
	}
	if r := C.sl_copy(l.d.c, l.stream, l.start, l.end, C.CUdeviceptr(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src))); r != 0 {
		return l.d.err("cuMemcpyHtoDAsync", r)
	}
	runtime.KeepAlive(src)
	return nil
}

func (l *cudaLane) wait() error {
	if r := C.sl_wait(l.d.c, l.end); r != 0 {
		return l.d.err("cuEventSynchronize", r)
	}
	return nil
}

func (l *cudaLane) elapsed() (time.Duration, error) {
	var ms C.float
	if r := C.sl_elapsed(l.d.c, l.start, l.end, &ms); r != 0 {
		return 0, l.d.err("cuEventElapsedTime", r)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

func (l *cudaLane) readBack(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	if r := C.sl_read_back(l.d.c, unsafe.Pointer(unsafe.SliceData(dst)), C.CUdeviceptr(src), C.size_t(len(dst))); r != 0 {
		return l.d.err("cuMemcpyDtoH", r)
	}
	return nil
}

func (l *cudaLane) destroy() error {
	if r := C.sl_lane_destroy(l.d.c, l.stream, l.start, l.end); r != 0 {
		return l.d.err("cuEventDestroy/cuStreamDestroy", r)
	}
	return nil
}
