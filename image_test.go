package shardload_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/shard"
)

// imageJPEG encodes a w x h picture with gradients and a pattern that depends on n.
func imageJPEG(t testing.TB, w, h, n int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetRGBA(x, y, color.RGBA{
				uint8(128 + 100*math.Sin(float64(x*(n%5+1))/17)),
				uint8(255 * y / h),
				uint8((x*y + 37*n) % 256), 255})
		}
	}
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 85}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// imageDataset writes 3 shards of 7 to 11 JPEGs of varied sizes with labels, and
// returns their infos and each sample's JPEG by key.
func imageDataset(t testing.TB) ([]shard.Info, map[string][]byte) {
	dir := t.TempDir()
	var infos []shard.Info
	jpgs := map[string][]byte{}
	for s, count := range []int{7, 11, 9} {
		var members [][2]string
		for i := range count {
			key := fmt.Sprintf("s%d/%03d", s, i)
			data := imageJPEG(t, 60+7*i, 40+5*((i+s)%6), s*100+i)
			jpgs[key] = data
			members = append(members, [2]string{key + ".jpg", string(data)}, [2]string{key + ".cls", fmt.Sprint(i)})
		}
		p := writeTar(t, filepath.Join(dir, fmt.Sprintf("img-%d.tar", s)), members...)
		infos = append(infos, shard.Info{URL: p, Samples: count})
	}
	return infos, jpgs
}

// imageEpoch reads one epoch and returns each key's image column bytes.
func imageEpoch(t testing.TB, cfg shardload.Config) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out := map[string][]byte{}
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		col, ok := b.Column("img")
		if !ok {
			t.Fatal("no img column")
		}
		if col.Ragged || col.DType != cfg.Fields[0].DType || len(col.Shape) != 4 || col.Shape[0] != b.Rows {
			t.Fatalf("img column %+v", col)
		}
		for i, k := range b.Keys() {
			out[k] = bytes.Clone(col.Row(b.Data(), i))
		}
	}
	return out
}

// TestImageFields: an image field's random crops and flips are a function of (seed,
// epoch, key): the same however many ranks read the epoch, resumed or not, and each
// row is what decode gives for that sample's JPEG and seed.
func TestImageFields(t *testing.T) {
	infos, jpgs := imageDataset(t)
	img := mustField(t, "img=jpg:image:uint8:24x32x3:random-crop,flip")
	cfg := shardload.Config{Shards: infos, Fields: []decode.Field{img, mustField(t, "cls")}, BatchSize: 4, Seed: 5, Workers: 3}
	one := imageEpoch(t, cfg)
	if len(one) != len(jpgs) {
		t.Fatalf("%d samples, want %d", len(one), len(jpgs))
	}
	var d decode.Decoder
	for key, data := range jpgs {
		d.Seed = decode.SampleSeed(5, 0, key)
		v, _, err := d.Decode(&img, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(v.Data, one[key]) {
			t.Fatalf("%s: the batch's pixels are not decode's for the sample's seed", key)
		}
	}
	again := imageEpoch(t, cfg)
	for k, v := range one {
		if !bytes.Equal(again[k], v) {
			t.Fatalf("%s: another run gave other pixels", k)
		}
	}
	// Two ranks: together the same pixels for every key.
	for rank := range 2 {
		c := cfg
		c.Rank, c.World, c.Workers = rank, 2, 1+rank
		for k, v := range imageEpoch(t, c) {
			if !bytes.Equal(one[k], v) {
				t.Fatalf("rank %d of 2: %s: other pixels than one rank's", rank, k)
			}
		}
	}
	// Resumed after two batches: the rest have the same pixels.
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := l.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := l.State()
	l.Close()
	c := cfg
	c.Resume = &st
	resumed := imageEpoch(t, c)
	if len(resumed) != len(jpgs)-8 {
		t.Fatalf("resumed epoch has %d samples, want %d", len(resumed), len(jpgs)-8)
	}
	for k, v := range resumed {
		if !bytes.Equal(one[k], v) {
			t.Fatalf("resumed: %s: other pixels", k)
		}
	}
	// The next epoch draws other crops.
	c = cfg
	c.Epoch = 1
	same := 0
	for k, v := range imageEpoch(t, c) {
		if bytes.Equal(one[k], v) {
			same++
		}
	}
	if same > 2 {
		t.Errorf("epoch 1: %d of %d samples have epoch 0's pixels", same, len(one))
	}
}

// TestImageErrorPolicy: a truncated JPEG and a member that is no image fail the
// loader naming the shard and the key, or, under Skip, are left out.
func TestImageErrorPolicy(t *testing.T) {
	dir := t.TempDir()
	good := imageJPEG(t, 64, 48, 1)
	var members [][2]string
	for i := range 8 {
		key := fmt.Sprintf("k%d", i)
		data := string(good)
		switch i {
		case 3:
			data = data[:len(data)*2/3]
		case 5:
			data = "<html>not found</html>"
		}
		members = append(members, [2]string{key + ".jpg", data}, [2]string{key + ".cls", "1"})
	}
	p := writeTar(t, filepath.Join(dir, "bad.tar"), members...)
	fields := []decode.Field{mustField(t, "img=jpg:image:uint8:16x16x3"), mustField(t, "cls")}
	cfg := shardload.Config{Shards: []shard.Info{{URL: p, Samples: 8}}, Fields: fields, BatchSize: 2, NoShuffle: true}
	ctx := context.Background()
	for _, dec := range []decode.ImageDecoder{decode.ImageDecoderAuto, decode.ImageDecoderGo} {
		cfg.ImageDecoder = dec
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = runToError(ctx, l)
		l.Close()
		if !errors.Is(err, decode.ErrBadImage) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), `"k3"`) {
			t.Errorf("%s: fail policy: %v; want a bad image naming %s and k3", dec, err, p)
		}
		c := cfg
		c.OnError, c.ErrorBudget = shardload.Skip, &shardload.Budget{Samples: 2}
		got := imageEpoch(t, c)
		if len(got) != 6 || got["k3"] != nil || got["k5"] != nil {
			t.Errorf("%s: skip policy delivered %d samples", dec, len(got))
		}
	}
}
