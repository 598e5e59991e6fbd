//go:build linux

package pinned_test

import (
	"context"
	"fmt"

	"github.com/shardload/shardload/pinned"
)

func ExampleNewRing() {
	ring, err := pinned.NewRing(pinned.Options{Slabs: 2, SlabBytes: 4 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ring.Close()

	// A collator takes a slab (waiting while the trainer holds them all), ...
	slab, err := ring.Acquire(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	// ... fills it with a batch, ...
	n := copy(slab.Bytes(), "a collated batch")
	fmt.Printf("batch of %d bytes in slab %d of %d bytes\n", n, slab.Index(), len(slab.Bytes()))
	fmt.Println("in use:", ring.InUse())

	// ... tells the trainer which slab to read (it mapped every slab's FD once),
	// and gives the slab back when the trainer says it is done.
	if err := ring.Release(slab); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("in use:", ring.InUse())
	// Output:
	// batch of 16 bytes in slab 0 of 4194304 bytes
	// in use: 1
	// in use: 0
}
