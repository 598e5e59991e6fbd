package mem

import (
	"runtime"
	"testing"
	"unsafe"
)

func TestMapHuge(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	b := MapHuge(2 * HugePage)
	if b == nil {
		t.Fatal("MapHuge failed")
	}
	defer Unmap(b)
	if len(b) != 2*HugePage || uintptr(unsafe.Pointer(&b[0]))%HugePage != 0 {
		t.Fatalf("len %d, address %p: want 2 huge pages, aligned", len(b), &b[0])
	}
	b[0], b[len(b)-1] = 1, 2
	if err := Prefault(make([]byte, 3*4096+5)); err != nil {
		t.Logf("MADV_POPULATE_WRITE not supported here: %v", err)
	}
}
