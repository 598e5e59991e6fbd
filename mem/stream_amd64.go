//go:build amd64 && cgo

package mem

/*
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static int sl_have_avx2(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

// sl_stream copies n bytes from src to dst, the bulk with non-temporal stores (32
// bytes at a time, dst aligned to 32) that bypass the cache, then an sfence so that
// the bytes are visible to other cores before the caller publishes them.
__attribute__((target("avx2")))
static void sl_stream(uint8_t *dst, const uint8_t *src, size_t n) {
	size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
	if (head > n) head = n;
	memcpy(dst, src, head);
	dst += head; src += head; n -= head;
	size_t i = 0;
	for (; i + 128 <= n; i += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
		__m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
		_mm256_stream_si256((__m256i *)(dst + i), a);
		_mm256_stream_si256((__m256i *)(dst + i + 32), b);
		_mm256_stream_si256((__m256i *)(dst + i + 64), c);
		_mm256_stream_si256((__m256i *)(dst + i + 96), d);
	}
	memcpy(dst + i, src + i, n - i);
	_mm_sfence();
}
*/
import "C"

import "unsafe"

var haveStream = C.sl_have_avx2() != 0

func stream(dst, src []byte) {
	C.sl_stream((*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(src))), C.size_t(len(src)))
}
