// A stand-in for libcuda.so.1 that the device tests build with the C compiler and
// load in its place: every driver function the stage calls, with device memory in
// host memory and copies done by memcpy. It checks what a real driver would: a
// context must be current on the calling thread, handles must be live. Its primary
// context release fails while anything is left allocated, registered or created, so
// a test sees leaks in Stage.Close's error.
//
// FAKECUDA_DEVICES sets how many GPUs it reports (default 1; 0 makes cuInit fail
// with CUDA_ERROR_NO_DEVICE, as on a machine whose driver finds none).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NO_DEVICE = 100, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201, INVALID_HANDLE = 400, ALREADY_REGISTERED = 712 };

typedef struct { int live; struct timespec at; int recorded; } event;
typedef struct { int live; } stream;

static __thread void *current;
static int retained;
static long allocs, regs, streams, events;
static void *registered[64];
static size_t max_alloc = (size_t)1 << 30;

static int devices(void) {
	const char *e = getenv("FAKECUDA_DEVICES");
	return e ? atoi(e) : 1;
}

CUresult cuInit(unsigned int flags) { return flags ? INVALID_VALUE : devices() == 0 ? NO_DEVICE : OK; }
CUresult cuDeviceGetCount(int *n) { *n = devices(); return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}
CUresult cuDeviceGetName(char *s, int n, CUdevice d) { snprintf(s, n, "Fake GPU %d", d); return OK; }
CUresult cuDeviceGetPCIBusId(char *s, int n, CUdevice d) { snprintf(s, n, "00000000:%02X:00.0", 0x3b + d); return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { retained++; *ctx = (void *)(0x1000L + d); return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	if (retained <= 0) return INVALID_CONTEXT;
	retained--;
	if (retained == 0 && (allocs || regs || streams || events)) {
		fprintf(stderr, "fakecuda: leaked %ld allocations, %ld registrations, %ld streams, %ld events\n", allocs, regs, streams, events);
		return INVALID_VALUE;
	}
	return OK;
}
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return OK; }

#define NEED_CONTEXT() do { if (!current) return INVALID_CONTEXT; } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CONTEXT();
	if (n == 0) return INVALID_VALUE;
	if (n > max_alloc) return OUT_OF_MEMORY;
	void *m = malloc(n);
	if (!m) return OUT_OF_MEMORY;
	*p = (CUdeviceptr)m;
	allocs++;
	return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CONTEXT(); free((void *)p); allocs--; return OK; }

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	NEED_CONTEXT();
	for (int i = 0; i < 64; i++) if (registered[i] == p) return ALREADY_REGISTERED;
	for (int i = 0; i < 64; i++) if (!registered[i]) { registered[i] = p; regs++; return OK; }
	return OUT_OF_MEMORY;
}
CUresult cuMemHostUnregister(void *p) {
	NEED_CONTEXT();
	for (int i = 0; i < 64; i++) if (registered[i] == p) { registered[i] = 0; regs--; return OK; }
	return INVALID_VALUE;
}

CUresult cuStreamCreate(void **s, unsigned int flags) {
	NEED_CONTEXT();
	stream *st = calloc(1, sizeof *st);
	st->live = 1;
	*s = st;
	streams++;
	return OK;
}
CUresult cuStreamDestroy_v2(void *s) {
	NEED_CONTEXT();
	stream *st = s;
	if (!st || !st->live) return INVALID_HANDLE;
	st->live = 0;
	free(st);
	streams--;
	return OK;
}
CUresult cuEventCreate(void **e, unsigned int flags) {
	NEED_CONTEXT();
	event *ev = calloc(1, sizeof *ev);
	ev->live = 1;
	*e = ev;
	events++;
	return OK;
}
CUresult cuEventDestroy_v2(void *e) {
	NEED_CONTEXT();
	event *ev = e;
	if (!ev || !ev->live) return INVALID_HANDLE;
	ev->live = 0;
	free(ev);
	events--;
	return OK;
}
CUresult cuEventRecord(void *e, void *s) {
	NEED_CONTEXT();
	event *ev = e;
	if (!ev || !ev->live || !s || !((stream *)s)->live) return INVALID_HANDLE;
	clock_gettime(CLOCK_MONOTONIC, &ev->at);
	ev->recorded = 1;
	return OK;
}
CUresult cuEventSynchronize(void *e) { NEED_CONTEXT(); return ((event *)e)->recorded ? OK : INVALID_HANDLE; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
	NEED_CONTEXT();
	event *s = a, *e = b;
	if (!s->recorded || !e->recorded) return INVALID_HANDLE;
	*ms = (e->at.tv_sec - s->at.tv_sec) * 1e3f + (e->at.tv_nsec - s->at.tv_nsec) / 1e6f;
	return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
	NEED_CONTEXT();
	if (!s || !((stream *)s)->live) return INVALID_HANDLE;
	memcpy((void *)dst, src, n);
	return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { NEED_CONTEXT(); memcpy(dst, (void *)src, n); return OK; }

static const char *names[][2] = {
	{"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"}, {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"}, {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
};
static int index_of(CUresult r) {
	switch (r) {
	case OK: return 0; case INVALID_VALUE: return 1; case OUT_OF_MEMORY: return 2; case NO_DEVICE: return 3;
	case INVALID_DEVICE: return 4; case INVALID_CONTEXT: return 5; case INVALID_HANDLE: return 6;
	}
	return -1;
}
CUresult cuGetErrorString(CUresult r, const char **s) { int i = index_of(r); if (i < 0) return INVALID_VALUE; *s = names[i][1]; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) { int i = index_of(r); if (i < 0) return INVALID_VALUE; *s = names[i][0]; return OK; }
