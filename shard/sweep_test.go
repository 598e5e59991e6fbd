package shard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// sweepShard is a small shard of samples with fields of several sizes (empty, under a
// block, over a block, exactly a block), in the shape real shards have.
func sweepShard(t testing.TB) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abcdefgh ijklmnop\n"[rng.IntN(18)]
		}
		return string(b)
	}
	var members []member
	for i, sizes := range [][]int{{700, 1}, {0, 2}, {512, 3}, {1500, 1}, {40, 2}, {1025, 1}} {
		key := fmt.Sprintf("s%02d", i)
		members = append(members, member{name: key + ".jpg", data: text(sizes[0])}, member{name: key + ".cls", data: text(sizes[1])})
		if i%2 == 0 {
			members = append(members, member{name: key + ".txt", data: text(30)})
		}
	}
	return buildTar(t, members...)
}

// sweepSample is what the sweep compares: a sample's key and fields, with data unless
// read with SizesOnly.
type sweepSample struct {
	key    string
	fields []Field
}

func (s sweepSample) String() string {
	var b strings.Builder
	b.WriteString(s.key)
	for _, f := range s.fields {
		fmt.Fprintf(&b, " %s=%d@%d:%x", f.Ext, f.Size, f.Offset, f.Data)
	}
	return b.String()
}

// sweepRead reads a shard as cat (every member's data) or as ls and the counting pass
// (SizesOnly, seeking past data or reading through it), and returns the samples and
// the error it ended with (io.EOF at a clean end).
func sweepRead(t *testing.T, data []byte, mode string) ([]sweepSample, error) {
	var src io.Reader = bytes.NewReader(data)
	if mode == "sizes-stream" {
		src = struct{ io.Reader }{src} // cannot seek
	}
	r := NewReader(src, Options{URL: "sweep", SizesOnly: mode != "full", MaxMemberSize: 1 << 20})
	defer r.Close()
	var out []sweepSample
	for {
		s, err := r.Next()
		if err != nil {
			var se *Error
			if err != io.EOF && (!errors.As(err, &se) || se.URL != "sweep") {
				t.Fatalf("error %v (%T) is no *Error naming the shard", err, err)
			}
			if err != io.EOF && se.Skippable() {
				t.Fatalf("sample error %v in a shard without bad samples", err)
			}
			if _, again := r.Next(); again != err {
				t.Fatalf("error not sticky: %v then %v", err, again)
			}
			return out, err
		}
		c := s.Clone()
		out = append(out, sweepSample{c.Key, c.Fields})
	}
}

func sameSamples(a, b []sweepSample) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].String() != b[i].String() {
			return false
		}
	}
	return true
}

func dump(s []sweepSample) string {
	var lines []string
	for _, x := range s {
		lines = append(lines, x.String())
	}
	return strings.Join(lines, "\n")
}

// TestCutAndFlipSweep cuts small plain, gzip and zstd shards at every few bytes and
// flips every few bytes (one at a time), and reads each as cat does and as ls and the
// counting pass do. Whatever the damage:
//
//   - a cut shard never reads to io.EOF, except a plain tar cut after the first block
//     of its end-of-archive marker (one zero block is accepted as the marker), and the
//     samples it gives before its error are the first samples of the whole shard, as
//     they are there;
//   - a flipped compressed shard never reads to io.EOF with any sample other than
//     the whole shard's (the gzip CRC-32 and the zstd checksum are verified at the
//     end), and a flipped plain shard never reads to io.EOF with other keys, fields
//     or sizes (a flip in member data is invisible in an uncompressed tar).
func TestCutAndFlipSweep(t *testing.T) {
	plain := sweepShard(t)
	modes := []string{"full", "sizes-seek", "sizes-stream"}
	want := map[string][]sweepSample{}
	for _, mode := range modes {
		got, err := sweepRead(t, plain, mode)
		if err != io.EOF || len(got) != 6 {
			t.Fatalf("%s: whole shard: %d samples, %v", mode, len(got), err)
		}
		want[mode] = got
	}
	// The data ranges of the plain shard, where a flip goes unnoticed.
	inData := func(pos int) bool {
		for _, s := range want["full"] {
			for _, f := range s.fields {
				if int64(pos) >= f.Offset && int64(pos) < f.Offset+f.Size {
					return true
				}
			}
		}
		return false
	}
	for _, c := range []Compression{None, Gzip, Zstd} {
		data := plain
		// Every few bytes: cuts and flips of the plain shard (18 KiB) land on every
		// part of a header, data and padding; the compressed shards are 2.5 KiB.
		step := 7
		if c != None {
			data = compress(t, c, plain)
			step = 2
		}
		if testing.Short() || testutil.Race {
			step *= 3
		}
		t.Run(c.String(), func(t *testing.T) {
			cuts, flips := 0, 0
			// Cut points include the end of the last member and the middle of the
			// end-of-archive marker.
			points := []int{len(data) - 2*blockSize, len(data) - blockSize - 1, len(data) - blockSize, len(data) - 1}
			for cut := 0; cut < len(data); cut += step {
				points = append(points, cut)
			}
			for _, cut := range points {
				for _, mode := range modes {
					got, err := sweepRead(t, data[:cut], mode)
					full := want[mode]
					if len(got) > len(full) || !sameSamples(got, full[:len(got)]) {
						t.Fatalf("cut at %d (%s): samples are no prefix of the shard's:\n%s", cut, mode, dump(got))
					}
					if err == io.EOF && len(got) != len(full) {
						t.Fatalf("cut at %d of %d (%s): read to the end with %d of %d samples", cut, len(data), mode, len(got), len(full))
					}
					// Only a plain tar cut after the first block of its end marker
					// reads to the end: a compressed one lacks the end of its stream.
					if err == io.EOF && (c != None || cut < len(data)-blockSize) {
						t.Fatalf("cut at %d of %d (%s): read to the end", cut, len(data), mode)
					}
					if err != io.EOF {
						cuts++
					}
				}
			}
			for pos := step / 2; pos < len(data); pos += step {
				bad := bytes.Clone(data)
				bad[pos] ^= 0xff
				for _, mode := range modes[:2] {
					got, err := sweepRead(t, bad, mode)
					if err != io.EOF {
						flips++
						continue
					}
					full := want[mode]
					if c == None && mode == "full" && inData(pos) {
						// Only the flipped byte may differ: compare without data.
						for i := range got {
							for j := range got[i].fields {
								got[i].fields[j].Data = nil
							}
						}
						full = want["sizes-seek"]
					}
					if !sameSamples(got, full) {
						t.Fatalf("byte %d of %d flipped (%s): read to the end with other samples:\n%s\nwant\n%s", pos, len(data), mode, dump(got), dump(full))
					}
				}
			}
			t.Logf("%d bytes: %d cut reads and %d flipped reads failed as they should", len(data), cuts, flips)
		})
	}
}
