package decode

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"image"
	"image/color"
	"image/gif"
	"io"
	"reflect"
	"slices"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// FuzzParseNPY is seeded with the real .npy members of the Lhotse shard (whole, and
// cut short), and with hand-built arrays of every header version and the rejected
// variants. For any input ParseNPY must not panic; what it accepts must be
// self-consistent, survive a numpy-style rewrite, and agree with Field.Decode.
func FuzzParseNPY(f *testing.F) {
	for _, b := range lhotseNPYs(f) {
		f.Add(b)
		f.Add(b[:128+64]) // header and a little data: truncated
		a, err := ParseNPY(b)
		if err != nil {
			f.Fatal(err)
		}
		// the same header with a small array: cheap for the fuzzer to mutate
		f.Add(npyFile(1, "<f4", false, []int{2, a.Shape[1] / 20}, seq(8*a.Shape[1]/20)))
	}
	f.Add(npyFile(1, "<f4", false, []int{3, 4}, seq(48)))
	f.Add(npyFile(2, "<i8", false, []int{2}, seq(16)))
	f.Add(npyFile(3, "|u1", false, []int{1, 1, 3}, seq(3)))
	f.Add(npyFile(1, "<c16", false, nil, seq(16)))
	f.Add(npyFile(1, "|b1", false, []int{0}, nil))
	f.Add(npyFile(1, "<f4", true, []int{2, 2}, seq(16)))
	f.Add(npyFile(1, ">f8", false, []int{1}, seq(8)))
	f.Add(npyFile(1, "<U3", false, []int{1}, seq(12)))
	f.Add(rawNPY(`{"shape": (2, 2), "descr": "<i4", "fortran_order": False}`, seq(16)))
	f.Add(rawNPY(`{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (1,), }`, seq(4)))
	f.Add(rawNPY(`{'descr': '<i2', 'fortran_order': False, 'shape': (3L, 2L), }`, seq(12)))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseNPY(data)
		field := Field{Name: "a", Ext: "npy", Kind: KindNPY}
		v, _, derr := field.Decode(data, nil)
		if (err == nil) != (derr == nil) {
			t.Fatalf("ParseNPY: %v; Decode: %v", err, derr)
		}
		// A Decoder keeping the last header it parsed gives what a fresh parse gives:
		// for the same member again, and for its header before a shorter array.
		var memo Decoder
		for i, m := range [][]byte{data, data, data[:max(len(data)-1, 0)], data} {
			mv, _, merr := memo.Decode(&field, m, nil)
			fv, _, ferr := field.Decode(m, nil)
			if (merr == nil) != (ferr == nil) || merr != nil && merr.Error() != ferr.Error() ||
				mv.DType != fv.DType || !slices.Equal(mv.Shape, fv.Shape) || !bytes.Equal(mv.Data, fv.Data) {
				t.Fatalf("member %d: a Decoder's memo gives %+v, %v; a fresh parse %+v, %v", i, mv, merr, fv, ferr)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrBadNPY) || !errors.Is(derr, ErrBadNPY) {
				t.Fatalf("error does not wrap ErrBadNPY: %v / %v", err, derr)
			}
			if a.Data != nil || a.Shape != nil {
				t.Fatal("values with an error")
			}
			return
		}
		if a.DType.IsZero() || a.FortranOrder || a.Shape == nil || len(a.Shape) > MaxDims {
			t.Fatalf("accepted %+v", a)
		}
		n, ok := byteSize(a.Shape, a.DType.Size())
		if !ok || int64(len(a.Data)) != n {
			t.Fatalf("shape %v dtype %v: %d data bytes", a.Shape, a.DType, len(a.Data))
		}
		if !bytes.HasSuffix(data, a.Data) || cap(a.Data) != len(a.Data) {
			t.Fatal("Data is not the input's tail")
		}
		if len(a.Data) > 0 && &a.Data[len(a.Data)-1] != &data[len(data)-1] {
			t.Fatal("Data does not alias the input")
		}
		if v.DType != a.DType || !slices.Equal(v.Shape, a.Shape) || !bytes.Equal(v.Data, a.Data) {
			t.Fatalf("Decode %+v, ParseNPY %+v", v, a)
		}
		// What numpy would write for the same array parses to the same array.
		re := npyFile(1, a.DType.Descr(), false, a.Shape, a.Data)
		if len(re) < 1<<16 {
			b, err := ParseNPY(re)
			if err != nil || !reflect.DeepEqual(a, b) {
				t.Fatalf("rewritten: %+v, %v; want %+v", b, err, a)
			}
		}
		// A field constraining exactly this dtype and shape accepts it (package wire
		// collates it).
		if len(a.Shape) > 0 && !slices.Contains(a.Shape, 0) {
			fixed := Field{Name: "a", Ext: "npy", Kind: KindNPY, DType: a.DType, Shape: a.Shape}
			if err := Validate(fixed); err != nil {
				t.Fatal(err)
			}
			v, _, err := fixed.Decode(data, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(v.Data, a.Data) || int64(len(v.Data)) != fixed.RowBytes() {
				t.Fatal("decoded value differs from the array's data")
			}
		}
	})
}

// FuzzParseField checks that ParseField never panics, that what it accepts passes
// Validate and round-trips through String, and that its errors wrap ErrInvalidField.
func FuzzParseField(f *testing.F) {
	for _, s := range []string{
		"cls", "label=cls:int", "img=jpg", "tokens=npy:npy:int32:2048", "caption=txt.gz:text",
		"x=npy:npy:float32:3x224x224", "x=npy:npy:float32:3xq", "meta=json.gz", "seg=seg.png",
		"a=npy:npy:<f4", "a=npy:npy:>f4", "=x", "a=b=c", "a:b:c:d:e", "__key__=txt", "TXT.GZ",
		"x=npy:npy:complex128:1x1x1x1", "b=gz:raw", "a=cls:int:int8",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		fl, err := ParseField(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidField) {
				t.Fatalf("%q: error %v does not wrap ErrInvalidField", spec, err)
			}
			return
		}
		if err := Validate(fl); err != nil {
			t.Fatalf("%q parsed to an invalid field: %v", spec, err)
		}
		back, err := ParseField(fl.String())
		if err != nil || !reflect.DeepEqual(back, fl) {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", spec, fl, fl.String(), back, err)
		}
		if fl.Name == "" || fl.Ext == "" {
			t.Fatalf("%q: empty name or ext: %+v", spec, fl)
		}
	})
}

// refGunzip is a reference for what a Gunzip field accepts, built from the standard
// library: gzip members one after another, each optionally followed by zero bytes
// (as Python's gzip module reads them), reserved header flags rejected (RFC 1952).
func refGunzip(src []byte) ([]byte, error) {
	if len(src) == 0 {
		return nil, errors.New("empty")
	}
	var out []byte
	br := bytes.NewReader(src)
	for first := true; ; first = false {
		if !first {
			for br.Len() > 0 {
				c, _ := br.ReadByte()
				if c != 0 {
					br.UnreadByte()
					break
				}
			}
			if br.Len() == 0 {
				return out, nil
			}
		}
		rest := src[len(src)-br.Len():]
		if len(rest) >= 4 && rest[3]&0xe0 != 0 {
			return nil, errors.New("reserved flags")
		}
		zr, err := stdgzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		zr.Multistream(false)
		b, err := io.ReadAll(zr)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
}

// FuzzGunzip compares the inflater of Gunzip fields with refGunzip: the same inputs
// succeed, with the same bytes; errors wrap ErrCorrupt, or ErrTooLarge past the cap.
func FuzzGunzip(f *testing.F) {
	members, names := readTar(f, "../testdata/webdataset__testgz.tar")
	for _, n := range names[:5] {
		f.Add(members[n])
	}
	text := []byte("hello, hello, hello gzip world")
	one := gzipBytes(text, stdgzip.Header{Name: "a.txt", Comment: "c", Extra: []byte{1, 2}})
	f.Add(one)
	f.Add(append(bytes.Clone(one), one...))
	f.Add(append(bytes.Clone(one), 0, 0))
	f.Add(gzipBytes(nil, stdgzip.Header{}))
	f.Add(gzipBytes(make([]byte, 5000), stdgzip.Header{}))
	f.Fuzz(func(t *testing.T, src []byte) {
		const limit = 1 << 16
		field := Field{Name: "t", Ext: "bin.gz", Gunzip: true, MaxBytes: limit}
		var d Decoder
		v, _, err := d.Decode(&field, src, make([]byte, 0, 7))
		want, rerr := refGunzip(src)
		switch {
		case rerr == nil && len(want) > limit:
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%d bytes over the cap: %v", len(want), err)
			}
		case rerr == nil:
			if err != nil {
				t.Fatalf("reference inflates %d bytes, Decode: %v", len(want), err)
			}
			if !bytes.Equal(v.Data, want) {
				t.Fatalf("Decode %q, reference %q", v.Data, want)
			}
		default:
			if err == nil {
				t.Fatalf("Decode accepted what the reference rejects (%v): %q", rerr, v.Data)
			}
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrTooLarge", err)
			}
		}
	})
}

func gzipBytes(b []byte, hdr stdgzip.Header) []byte {
	var out bytes.Buffer
	w := stdgzip.NewWriter(&out)
	w.Header = hdr
	w.Write(b)
	w.Close()
	return out.Bytes()
}

// FuzzDecodeImage is seeded with small JPEGs (4:2:0, grayscale, CMYK), one cut
// short and one cut with an end marker appended, two without their quantization or
// Huffman tables, a PNG of the real tarproc shard,
// and a GIF. For any input, with either JPEG decoder, Decode must not panic and must
// give either the field's exact row or an error wrapping ErrBadImage, and whether it
// fails must not depend on the crop (another seed) nor on the decoder's history (a
// fresh decoder fails or gives the same bytes). Images are capped at 64 KiB decoded
// so that the fuzzer's bombs stay cheap.
func FuzzDecodeImage(f *testing.F) {
	small := encodeJPEG(f, photo(24, 16, 1))
	f.Add(small)
	f.Add(small[:len(small)*2/3])
	f.Add(append(small[:len(small)*2/3:len(small)*2/3], 0xff, 0xd9))
	// Without quantization tables, then without Huffman tables: a decoder that lent
	// an earlier image's tables decoded the first depending on its history.
	f.Add(testutil.JPEGWithout(f, small, 0xdb))
	f.Add(testutil.JPEGWithout(f, small, 0xc4))
	gray := image.NewGray(image.Rect(0, 0, 9, 7))
	for i := range gray.Pix {
		gray.Pix[i] = uint8(i * 3)
	}
	f.Add(encodeJPEG(f, gray))
	cmyk := image.NewCMYK(image.Rect(0, 0, 8, 8))
	f.Add(encodeJPEG(f, cmyk))
	f.Add(encodePNG(f, photo(5, 3, 2)))
	for _, s := range tarprocSamples(f)[:2] {
		f.Add(s)
	}
	var g bytes.Buffer
	pal := image.NewPaletted(image.Rect(0, 0, 4, 4), color.Palette{color.Black, color.White})
	gif.Encode(&g, pal, nil)
	f.Add(g.Bytes())
	fields := []Field{mustField(f, "i=x:image:uint8:8x6x3:random-crop,flip"), mustField(f, "i=x:image:float16:1x5x5:resize=9")}
	for i := range fields {
		fields[i].MaxBytes = 64 << 10
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for i := range fields {
			fd := &fields[i]
			for _, be := range []ImageDecoder{ImageDecoderAuto, ImageDecoderGo} {
				d := Decoder{Images: be, Seed: uint64(len(data))}
				v, _, err := d.Decode(fd, data, nil)
				other := Decoder{Images: be, Seed: uint64(len(data)) + 1}
				if _, _, oerr := other.Decode(fd, data, nil); (oerr == nil) != (err == nil) {
					t.Fatalf("%s: seed %d: %v; seed %d: %v", be, d.Seed, err, other.Seed, oerr)
				}
				if err != nil {
					if !errors.Is(err, ErrBadImage) {
						t.Fatalf("%s: error %v does not wrap ErrBadImage", be, err)
					}
					continue
				}
				if int64(len(v.Data)) != fd.RowBytes() {
					t.Fatalf("%s: %d bytes, want %d", be, len(v.Data), fd.RowBytes())
				}
				// The same seed again, by the decoder that decoded another crop: the
				// same bytes.
				other.Seed = d.Seed
				w, _, err := other.Decode(fd, data, nil)
				if err != nil || !bytes.Equal(w.Data, v.Data) {
					t.Fatalf("%s: decoded again: %v (the same bytes: %v)", be, err, err == nil && bytes.Equal(w.Data, v.Data))
				}
			}
		}
	})
}
