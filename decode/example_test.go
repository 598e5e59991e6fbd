package decode_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"
	"image/png"
	"log"
	"math"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/wire"
)

// Example parses field specs (as given to --field), decodes two samples' members
// and collates them into a slab (package wire), then reads the batch back.
func Example() {
	var fields []decode.Field
	for _, spec := range []string{"label=cls", "emb=npy:npy:float32:4", "caption=txt"} {
		f, err := decode.ParseField(spec)
		if err != nil {
			log.Fatal(err)
		}
		fields = append(fields, f)
	}

	// Two samples, as shard.Reader would give them: extension -> member bytes.
	samples := []struct {
		key     string
		members map[string][]byte
	}{
		{"cat/001", map[string][]byte{"cls": []byte("3\n"), "npy": npy4(1), "txt": []byte("a cat")}},
		{"dog/007", map[string][]byte{"cls": []byte("5\n"), "npy": npy4(2), "txt": []byte("a sleepy dog")}},
	}

	var d decode.Decoder
	keys := make([]string, len(samples))
	rows := make([][]decode.Value, len(samples))
	for i, s := range samples {
		keys[i] = s.key
		rows[i] = make([]decode.Value, len(fields))
		for j := range fields {
			data, ok := s.members[fields[j].Ext]
			if !ok {
				log.Fatal(&decode.FieldError{Field: fields[j].ColumnName(), Ext: fields[j].Ext, Err: decode.ErrMissing})
			}
			v, _, err := d.Decode(&fields[j], data, nil)
			if err != nil {
				log.Fatalf("sample %s: %v", s.key, err)
			}
			rows[i][j] = v
		}
	}

	slab := make([]byte, 4096) // in shardload, a pinned.Slab's bytes
	batch, err := wire.Collate(slab, fields, keys, rows)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range batch.Columns {
		fmt.Printf("%-8s %-5s ragged=%-5v dtype=%-7v shape=%v offset=%d\n", c.Name, c.Kind, c.Ragged, c.DType, c.Shape, c.Offset)
	}
	label, _ := batch.Column("label")
	caption, _ := batch.Column("caption")
	fmt.Println(label.Int64s(slab), string(caption.Row(slab, 1)))
	fmt.Println("used", batch.Used, "of", len(slab), "bytes")
	// Output:
	// label    int   ragged=false dtype=int64   shape=[2] offset=0
	// emb      npy   ragged=false dtype=float32 shape=[2 4] offset=64
	// caption  text  ragged=true  dtype=uint8   shape=[17] offset=192
	// __key__  text  ragged=true  dtype=uint8   shape=[14] offset=320
	// [3 5] a sleepy dog
	// used 334 of 4096 bytes
}

// npy4 returns a .npy file of 4 float32 elements as numpy writes it (16 bytes of
// data; each byte is v).
func npy4(v byte) []byte {
	header := "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
	header += "                    " // numpy's spare space for growing the first axis
	pad := 64 - (10+len(header)+1)%64
	b := []byte("\x93NUMPY\x01\x00")
	n := len(header) + pad + 1
	b = append(b, byte(n), byte(n>>8))
	b = append(b, header...)
	for range pad {
		b = append(b, ' ')
	}
	b = append(b, '\n')
	for range 16 {
		b = append(b, v)
	}
	return b
}

// ExampleDecoder_image decodes a PNG into an image field's fixed-shape column: a
// 6x4 picture, resized so that its shorter side is 2 and center-cropped to 2x2, as
// CHW float32 scaled to [0, 1]. Random transforms (random-crop, flip) would draw
// from Seed, set per sample with SampleSeed.
func ExampleDecoder_image() {
	f, err := decode.ParseField("img=png:image:float32:3x2x2")
	if err != nil {
		log.Fatal(err)
	}
	pic := image.NewGray(image.Rect(0, 0, 6, 4))
	for i := range pic.Pix {
		pic.Pix[i] = 255 // white
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, pic); err != nil {
		log.Fatal(err)
	}
	var d decode.Decoder
	d.Seed = decode.SampleSeed(42, 0, "sample-0001")
	v, _, err := d.Decode(&f, buf.Bytes(), nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(f, v.DType.Name(), v.Shape, len(v.Data), "bytes")
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(v.Data)))
	// Output:
	// img=png:image:float32:3x2x2 float32 [3 2 2] 48 bytes
	// 1
}
