package cache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
)

// The fetch behind a range read of an object not cached takes free room only, under
// either policy, hints or not: it evicts no entry, and the ranges are read from the
// source as ranges. With free room it fetches the object.
func TestFetchBehindTakesFreeRoomOnly(t *testing.T) {
	for _, tc := range []struct {
		name      string
		policy    Policy
		hints     bool
		room      int64 // disk budget
		wantB     bool  // b fetched into the cache
		wantA     bool  // a still cached
		wantEvict int64
	}{
		{"hints, full", PolicyOrder, true, 80_000, false, true, 0},
		{"hints, room", PolicyOrder, true, 1 << 20, true, true, 0},
		{"no hints", PolicyOrder, false, 80_000, false, true, 0},
		{"lru", PolicyLRU, true, 80_000, false, true, 0},
		{"lru, room", PolicyLRU, false, 1 << 20, true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &rangeFake{fakeSource: newFake()}
			up.put("mem://b/a.bin", randBytes(1, 50_000), "v1")
			up.put("mem://b/b.bin", randBytes(2, 50_000), "v1")
			reg := &source.Registry{}
			reg.Register("mem", up)
			_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: tc.room, Policy: tc.policy}, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r, err := c.Open(t.Context(), "mem://b/a.bin") // a, cached whole
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r)
			r.Close()
			if tc.hints {
				// The reader reads b by ranges from now to its last in a minute, and a
				// in an hour: by next use b would take a's room.
				now := time.Now()
				h := hint(t, c, "job", []HintEntry{{URL: "mem://b/b.bin", At: now.UnixNano()}, {URL: "mem://b/b.bin", At: now.Add(time.Minute).UnixNano()},
					{URL: "mem://b/a.bin", At: now.Add(time.Hour).UnixNano()}})
				defer h.Close()
			}
			for _, off := range []int64{0, 20_000, 40_000} {
				r, err := c.OpenRange(t.Context(), "mem://b/b.bin", off, 10_000)
				if err != nil {
					t.Fatal(err)
				}
				if n, _ := io.Copy(io.Discard, r); n != 10_000 {
					t.Fatalf("range at %d: %d bytes", off, n)
				}
				r.Close()
				c.behindWG.Wait()
			}
			_, gotA := c.cachedVersion("mem://b/a.bin")
			_, gotB := c.cachedVersion("mem://b/b.bin")
			st := c.Stats()
			if gotA != tc.wantA || gotB != tc.wantB || st.Evicted != tc.wantEvict {
				t.Errorf("a cached %v, b cached %v, %d evicted; want %v, %v, %d (stats %+v)", gotA, gotB, st.Evicted, tc.wantA, tc.wantB, tc.wantEvict, st)
			}
		})
	}
}

// Objects read by ranges all epoch long, in an order reshuffled every epoch (a
// packed epoch's .bin files), on a disk that holds half of them: the ones fetched
// behind the first ranges stay, the others are read as ranges, so each epoch after
// the first reads half the corpus from the source, under either policy. When a fetch
// behind a range took the room of another object, each epoch here read 4.4-6.4 times
// the corpus.
func TestRangesAllEpochLongFetchHalf(t *testing.T) {
	const objects, size, piece = 6, 50_000, 5_000
	for _, policy := range []Policy{PolicyOrder, PolicyLRU} {
		up := &rangeFake{fakeSource: newFake()}
		var urls []string
		for i := range objects {
			u := fmt.Sprintf("mem://b/c%02d.bin", i)
			up.put(u, randBytes(uint64(i), size), "v1")
			urls = append(urls, u)
		}
		reg := &source.Registry{}
		reg.Register("mem", up)
		// Room for 3 objects and their meta files, not 4.
		_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 3*size + 10_000, Policy: policy}, reg)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(5, uint64(policy)))
		var perEpoch []float64
		for range 4 {
			before := c.Stats()
			var reads [][2]int64 // object, offset
			for o := range objects {
				for off := int64(0); off < size; off += piece {
					reads = append(reads, [2]int64{int64(o), off})
				}
			}
			rng.Shuffle(len(reads), func(i, j int) { reads[i], reads[j] = reads[j], reads[i] })
			for _, rd := range reads {
				r, err := c.OpenRange(t.Context(), urls[rd[0]], rd[1], piece)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, r)
				r.Close()
				c.behindWG.Wait() // each fetch behind done before the next read
			}
			st := c.Stats()
			perEpoch = append(perEpoch, float64(st.BytesFetched+st.BytesBypassed-before.BytesFetched-before.BytesBypassed)/(objects*size))
		}
		c.Close()
		t.Logf("%v: the source read %.2f of the corpus each epoch", policy, perEpoch)
		for e, f := range perEpoch[1:] {
			if f > 0.51 {
				t.Errorf("%v: epoch %d read %.2f of the corpus from the source, want half (the disk holds the rest)", policy, e+1, f)
			}
		}
	}
}

// A range of an object whose fetch behind is in flight and has written that range
// already is read from the fetch, not from the source again; a range the fetch has
// not reached yet is read from the source, not waited for.
func TestRangeBehindTheFetchJoinsIt(t *testing.T) {
	up := &rangeFake{fakeSource: newFake()}
	data := randBytes(3, 3<<20)
	up.put("mem://b/big.bin", data, "v1")
	pr, pw := io.Pipe()
	up.pipe = pr
	reg := &source.Registry{}
	reg.Register("mem", up)
	_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 64 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer pw.CloseWithError(errors.New("test over")) // before Close, which waits for the fetch
	read := func(off, n int64) {
		t.Helper()
		r, err := c.OpenRange(t.Context(), "mem://b/big.bin", off, n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data[off:off+n]) {
			t.Fatalf("range at %d: %d bytes, %v", off, len(got), err)
		}
	}
	read(0, 1000) // from the source; the fetch behind starts, its stream held
	if up.ranges != 1 {
		t.Fatalf("%d ranged reads of the source, want 1", up.ranges)
	}
	go pw.Write(data[:2<<20])
	testutil.WaitFor(t, "the fetch behind has written 2 MiB", func() bool {
		c.mu.Lock()
		f := c.fills[key("mem://b/big.bin")]
		c.mu.Unlock()
		if f == nil {
			return false
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.n >= 2<<20
	})
	joined := c.Stats().BytesJoined
	read(500_000, 100_000) // written already: from the fetch
	if up.ranges != 1 || c.Stats().BytesJoined != joined+100_000 {
		t.Fatalf("a range the fetch had written: %d ranged reads of the source (want 1), %d bytes joined", up.ranges, c.Stats().BytesJoined-joined)
	}
	read(2<<20+1000, 1000) // not yet: from the source
	if up.ranges != 2 {
		t.Fatalf("a range ahead of the fetch: %d ranged reads of the source, want 2", up.ranges)
	}
	go func() { pw.Write(data[2<<20:]); pw.Close() }()
	c.behindWG.Wait()
	if _, ok := c.cachedVersion("mem://b/big.bin"); !ok {
		t.Fatal("the object was not cached")
	}
}
