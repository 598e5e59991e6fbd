package decode

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// sosEnd returns the offset of the first byte of data's first entropy-coded scan.
func sosEnd(tb testing.TB, data []byte) int {
	tb.Helper()
	i := bytes.Index(data, []byte{0xff, 0xda})
	if i < 0 || i+4 > len(data) {
		tb.Fatal("no SOS marker")
	}
	return i + 2 + (int(data[i+2])<<8 | int(data[i+3]))
}

// scanEnd returns the offset of the marker that ends the scan whose data starts at s.
func scanEnd(data []byte, s int) int {
	for j := s; j+1 < len(data); j++ {
		if data[j] == 0xff && data[j+1] != 0 && (data[j+1] < 0xd0 || data[j+1] > 0xd7) {
			return j
		}
	}
	return len(data)
}

// lastSOS returns the offset of data's last SOS marker.
func lastSOS(tb testing.TB, data []byte) int {
	tb.Helper()
	i := bytes.LastIndex(data, []byte{0xff, 0xda})
	if i < 0 {
		tb.Fatal("no SOS marker")
	}
	return i
}

// badJPEG is a JPEG that is not whole or not sound, and how it was made.
type badJPEG struct {
	name string
	data []byte
}

// corruptJPEGs returns, for each of goods, the damaged copies a shard can hold:
// cut at half, in the middle of its (first) scan, just after the scan's header,
// just before its end marker; cut and then given an end marker (what libjpeg
// calls a premature end of data segment: the data ends with FF D9, so a decode
// that stops above the cut would not see it); and a run of bytes in the scan
// replaced by ones, a bad Huffman code, in a JPEG otherwise whole.
func corruptJPEGs(tb testing.TB, names []string, goods [][]byte) []badJPEG {
	var out []badJPEG
	for i, g := range goods {
		s := sosEnd(tb, g)
		mid := s + (scanEnd(g, s)-s)/2
		cut := func(what string, n int) {
			out = append(out, badJPEG{fmt.Sprintf("%s %s (%d of %d bytes)", names[i], what, n, len(g)), slices.Clip(g[:n])})
		}
		cut("cut at half", len(g)/2)
		cut("cut mid-scan", mid)
		cut("cut after the scan header", s+1)
		cut("cut before EOI", len(g)-2)
		cut("cut inside EOI", len(g)-1)
		if last := lastSOS(tb, g); last > s {
			cut("cut before its last scan", last)
		}
		for _, at := range []int{mid, s + (mid-s)/4} {
			b := append(slices.Clone(g[:at]), 0xff, 0xd9)
			out = append(out, badJPEG{fmt.Sprintf("%s cut at %d of %d bytes, EOI appended", names[i], at, len(g)), b})
		}
		b := slices.Clone(g)
		for j := mid; j+1 < mid+64 && j+1 < scanEnd(g, s); j += 2 {
			b[j], b[j+1] = 0xff, 0x00
		}
		out = append(out, badJPEG{fmt.Sprintf("%s with ones at scan byte %d", names[i], mid), b})
	}
	return out
}

// TestImageCorruptJPEGNeverDecodes decodes cut and corrupt JPEGs thousands of times
// through the pooled decoders, from several goroutines, interleaved with good JPEGs
// and with crops, sizes and random-resized crops that take every path (whole,
// partial, by strips, scaled in the DCT): a damaged JPEG is an ErrBadImage every
// time, and a good one decodes to the same bytes every time.
func TestImageCorruptJPEGNeverDecodes(t *testing.T) {
	names := []string{"photo 500x375", "photo 320x240"}
	goods := [][]byte{encodeJPEG(t, photo(500, 375, 41)), encodeJPEG(t, photo(320, 240, 42))}
	for _, n := range []string{"prog420.jpg", "s444.jpg", "s422.jpg"} {
		data, err := os.ReadFile("turbojpeg/testdata/" + n)
		if err != nil {
			t.Fatal(err)
		}
		names, goods = append(names, n), append(goods, data)
	}
	bads := corruptJPEGs(t, names, goods)
	specs := []string{
		"img=jpg:image:uint8:224x224x3",
		"img=jpg:image:uint8:3x224x224:resize=256",
		"img=jpg:image:uint8:224x224x3:random-crop,flip",
		"img=jpg:image:float32:3x224x224:random-crop,flip,imagenet",
		"img=jpg:image:uint8:32x32x3:random-crop,scale=0.05-0.3",
		"img=jpg:image:uint8:40x30x3",
		"img=jpg:image:uint8:64x64x1:random-crop,full-decode",
		"img=jpg:image",
	}
	fields := make([]Field, len(specs))
	for i, s := range specs {
		fields[i] = mustField(t, s)
	}
	const seeds = 6
	for _, be := range decoders(t) {
		t.Run(be.String(), func(t *testing.T) {
			// Every damaged JPEG fails in every spec and seed, alone.
			for _, b := range bads {
				for i := range fields {
					d := Decoder{Images: be, Seed: 1}
					if v, _, err := d.Decode(&fields[i], b.data, nil); !errors.Is(err, ErrBadImage) {
						t.Errorf("%s, %s: got %d bytes and error %v, want ErrBadImage", b.name, specs[i], len(v.Data), err)
					}
				}
			}
			if t.Failed() {
				return
			}
			// What a fresh decoder gives for each good JPEG, spec and seed.
			want := make(map[[3]int][]byte)
			for g, data := range goods {
				for i := range fields {
					for s := range seeds {
						d := Decoder{Images: be, Seed: uint64(s)}
						want[[3]int{g, i, s}] = decodeImg(t, &d, specs[i], data)
					}
				}
			}
			workers, per := 8, 800
			if be == ImageDecoderGo {
				per = 150
			}
			if testing.Short() {
				per /= 4
			}
			var wg sync.WaitGroup
			errs := make(chan string, workers)
			var mu sync.Mutex
			badRuns, goodRuns := 0, 0
			for w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 77))
					d := Decoder{Images: be}
					nb, ng := 0, 0
					defer func() {
						mu.Lock()
						badRuns += nb
						goodRuns += ng
						mu.Unlock()
					}()
					for range per {
						i, s := r.IntN(len(fields)), r.IntN(seeds)
						d.Seed = uint64(s)
						if r.IntN(2) == 0 {
							b := bads[r.IntN(len(bads))]
							nb++
							v, _, err := d.Decode(&fields[i], b.data, nil)
							if !errors.Is(err, ErrBadImage) {
								errs <- fmt.Sprintf("%s, %s, seed %d: got %d bytes and error %v, want ErrBadImage", b.name, specs[i], s, len(v.Data), err)
								return
							}
						} else {
							g := r.IntN(len(goods))
							ng++
							v, _, err := d.Decode(&fields[i], goods[g], nil)
							if err != nil {
								errs <- fmt.Sprintf("%s, %s, seed %d: %v", names[g], specs[i], s, err)
								return
							}
							if !bytes.Equal(v.Data, want[[3]int{g, i, s}]) {
								errs <- fmt.Sprintf("%s, %s, seed %d: decoded differently from a fresh decoder", names[g], specs[i], s)
								return
							}
						}
						if r.IntN(16) == 0 {
							d.Release() // the next image takes scratch another worker used
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
			t.Logf("%d damaged and %d good decodes from %d goroutines (%d damaged JPEGs)", badRuns, goodRuns, workers, len(bads))
		})
	}
}

// TestImageExtraneousBytes: junk between a JPEG's last scan and its end marker,
// which libjpeg reports as extraneous bytes and PIL and Go's decoder skip, leaves
// every pixel whole: the image decodes as the clean JPEG does, by every decoder,
// crop and path. (The same warning after an invalid Huffman code is an error: see
// TestImageCorruptJPEGNeverDecodes.)
func TestImageExtraneousBytes(t *testing.T) {
	clean := encodeJPEG(t, photo(320, 240, 43))
	junk := append(append(slices.Clone(clean[:len(clean)-2]), "junk after the scan"...), 0xff, 0xd9)
	prog, err := os.ReadFile("turbojpeg/testdata/prog420.jpg")
	if err != nil {
		t.Fatal(err)
	}
	progJunk := append(append(slices.Clone(prog[:len(prog)-2]), "junk"...), 0xff, 0xd9)
	specs := []string{
		"img=jpg:image:uint8:224x224x3", "img=jpg:image:uint8:224x224x3:random-crop,flip",
		"img=jpg:image:uint8:32x32x3:random-crop,scale=0.05-0.3", "img=jpg:image:uint8:40x30x3", "img=jpg:image",
	}
	for _, be := range decoders(t) {
		for _, pair := range [][2][]byte{{clean, junk}, {prog, progJunk}} {
			for _, spec := range specs {
				for s := range uint64(4) {
					want := decodeImg(t, &Decoder{Images: be, Seed: s}, spec, pair[0])
					got := decodeImg(t, &Decoder{Images: be, Seed: s}, spec, pair[1])
					if !bytes.Equal(got, want) {
						t.Errorf("%s, %s, seed %d: junk before the end marker changed the pixels", be, spec, s)
					}
				}
			}
		}
	}
}

// TestImageTablesLeftOut: a JPEG without its quantization tables is the sample's
// error with either decoder (libjpeg, and PIL, refuse it; Go's image/jpeg would
// decode it flat gray), whatever the decoder decoded before; one without its
// Huffman tables decodes with the standard tables, as a fresh libjpeg (and PIL) does, never with those of an image decoded before it; Go's
// decoder, given the standard tables first, decodes it as it decodes the whole JPEG
// (image/jpeg writes the standard tables).
func TestImageTablesLeftOut(t *testing.T) {
	src := photo(64, 48, 5)
	jpg := encodeJPEG(t, src)
	noDQT := testutil.JPEGWithout(t, jpg, 0xdb)
	noDHT := testutil.JPEGWithout(t, jpg, 0xc4)
	// Earlier images with tables of their own: a progressive JPEG (optimised
	// Huffman tables) and the tarproc shard's baseline ones.
	prog, err := os.ReadFile("turbojpeg/testdata/prog420.jpg")
	if err != nil {
		t.Fatal(err)
	}
	specs := []string{"i=jpg:image:uint8:48x64x3", "i=jpg:image:uint8:32x32x3:random-crop,flip", "i=jpg:image:uint8:3x16x16:resize=20"}
	for _, be := range decoders(t) {
		for _, spec := range specs {
			f := mustField(t, spec)
			fresh := Decoder{Images: be, Seed: 7}
			want, _, err := fresh.Decode(&f, jpg, nil)
			if err != nil {
				t.Fatal(err)
			}
			want.Data = slices.Clone(want.Data)
			for seed := range uint64(4) {
				d := Decoder{Images: be, Seed: seed}
				if _, _, err := d.Decode(&f, prog, nil); err != nil {
					t.Fatalf("%s: %s: the progressive JPEG: %v", be, spec, err)
				}
				_, _, err := d.Decode(&f, noDQT, nil)
				wantErr(t, err, ErrBadImage, "quantization table 0 of component 1 is not defined before its first scan")
				if _, _, err := d.Decode(&f, prog, nil); err != nil {
					t.Fatal(err)
				}
				d.Seed = 7
				got, _, err := d.Decode(&f, noDHT, nil)
				if err != nil {
					t.Fatalf("%s: %s: without Huffman tables: %v", be, spec, err)
				}
				if !bytes.Equal(got.Data, want.Data) {
					m, mx := meanAbsDiff(got.Data, want.Data)
					t.Fatalf("%s: %s: without Huffman tables, after other images: differs from the whole JPEG by %.2f on average, %d at most", be, spec, m, mx)
				}
			}
		}
	}
}

// standardHuffman holds the four tables of ITU T.81 K.3 in their slots: DC 0 and 1,
// AC 0 and 1, with the spec's code counts.
func TestStandardHuffman(t *testing.T) {
	want := map[byte][16]byte{
		0x00: {0, 1, 5, 1, 1, 1, 1, 1, 1},
		0x01: {0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
		0x10: {0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7d},
		0x11: {0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77},
	}
	seg := standardHuffman()
	if len(seg) < 4 || seg[0] != 0xff || seg[1] != 0xc4 || int(seg[2])<<8|int(seg[3]) != len(seg)-2 {
		t.Fatalf("not a DHT segment: % x", seg[:min(len(seg), 4)])
	}
	got := map[byte][16]byte{}
	for p := seg[4:]; len(p) > 0; {
		var counts [16]byte
		copy(counts[:], p[1:17])
		n := 17
		for _, c := range counts {
			n += int(c)
		}
		got[p[0]] = counts
		p = p[n:]
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("tables %v, want %v", got, want)
	}
}
