package index_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/shardload/shardload/index"
)

// ReadLayout reads back where WriteAddressable put the parts, which add up to the
// index's bytes; BlockStarts lays the shards out in blocks as WriteAddressable does;
// an index of the earlier format is not addressable.
func TestLayout(t *testing.T) {
	for _, n := range []int{1, 700, 5000} {
		infos := fetchShards(n, 1+n%97)
		var buf bytes.Buffer
		if err := index.WriteAddressable(&buf, infos); err != nil {
			t.Fatal(err)
		}
		size := int64(buf.Len())
		l, ok, err := index.ReadLayout(&buf, "test")
		if err != nil || !ok {
			t.Fatalf("%d shards: %v, addressable %v", n, err, ok)
		}
		if l.Size() != size || l.Head <= 0 || l.Counts <= 0 {
			t.Fatalf("%d shards: layout %+v of %d bytes, the index has %d", n, l, l.Size(), size)
		}
		if got := index.BlockStarts(infos); !slices.Equal(got, l.First) {
			t.Fatalf("%d shards: BlockStarts %v, the index's blocks start at %v", n, got, l.First)
		}
		for k, first := range l.First {
			if l.Block(first) != k || (first > 0 && l.Block(first-1) != k-1) {
				t.Fatalf("%d shards: Block(%d) = %d, want %d", n, first, l.Block(first), k)
			}
		}
		buf.Reset()
		if err := index.Write(&buf, infos, true); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := index.ReadLayout(&buf, "test"); ok || err != nil {
			t.Fatalf("an index of the earlier format: addressable %v, %v", ok, err)
		}
	}
}
