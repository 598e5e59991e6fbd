package device_test

import (
	"context"
	"fmt"

	"github.com/shardload/shardload/device"
)

func ExampleOpen() {
	// "auto" copies to GPU 0 when there is one; this example asks for host memory so
	// its output is the same everywhere.
	stage, err := device.Open(device.Options{Kind: device.Host})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stage.Close()

	batch := []byte("a collated batch in a pinned slab")
	_ = stage.Register(batch) // pins it for DMA (cuda); nothing to do for host
	tr, err := stage.Copy(context.Background(), batch)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The trainer waits for the copy, computes on the batch at tr.Ptr(), then
	// hands the buffer back so the next batch can be copied into it.
	if err := tr.Wait(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	tr.Release()
	st := stage.Stats()
	fmt.Println(stage.Kind(), st.Copies, st.Bytes)
	// Output: host 1 33
}
