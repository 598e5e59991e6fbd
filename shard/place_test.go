package shard

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"unsafe"
)

// Options.Place puts a member's data where it says when it gives exactly the
// member's size: the field's Data is then that memory, and the sample's buffer holds
// the other members only, also when it grows after the placed member (regrow moves
// the buffer's fields, never the placed one). A destination of another size, or
// none, reads the member as usual.
func TestPlaceReadsMembersWhereTold(t *testing.T) {
	big := strings.Repeat("B", 5000)
	data := buildTar(t,
		member{name: "a.jpg", data: "jjjjjj"}, member{name: "a.y", data: big}, // y outgrows the buffer after jpg was placed
		member{name: "b.jpg", data: "kk"}, member{name: "b.y", data: "yy"},
		member{name: "c.jpg", data: "lll"}, member{name: "c.y", data: "z"})
	dsts := map[string][]byte{"a": make([]byte, 6), "b": make([]byte, 5), "c": make([]byte, 3)} // b's is the wrong size
	bufs := &countingBuffers{out: map[*byte]int{}}
	r := NewReader(bytes.NewReader(data), Options{Buffers: bufs, Place: func(key string, f Field) []byte {
		if f.Ext != "jpg" {
			return nil
		}
		return dsts[key]
	}})
	want := map[string][2]string{"a": {"jjjjjj", big}, "b": {"kk", "yy"}, "c": {"lll", "z"}}
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		jpg, _ := s.Get("jpg")
		y, _ := s.Get("y")
		if string(jpg) != want[s.Key][0] || string(y) != want[s.Key][1] {
			t.Fatalf("%s: jpg %q y %.10q", s.Key, jpg, y)
		}
		inDst := unsafe.SliceData(jpg) == unsafe.SliceData(dsts[s.Key])
		if inDst != (s.Key != "b") {
			t.Fatalf("%s: jpg read to its destination: %v", s.Key, inDst)
		}
		if inDst && len(s.Buf) != len(y) || !inDst && len(s.Buf) != len(jpg)+len(y) {
			t.Fatalf("%s: the sample's buffer holds %d bytes", s.Key, len(s.Buf))
		}
		bufs.Put(s.Buf)
	}
	r.Close()
	if len(bufs.out) != 0 {
		t.Fatalf("%d buffers not given back", len(bufs.out))
	}
}
