package cache

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
)

// readTallied reads url through src with t in the open's context.
func readTallied(t *testing.T, src source.Source, url string, tl *Tally) {
	t.Helper()
	r, err := src.Open(WithTally(t.Context(), tl), url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	defer r.Close()
	if _, err := io.ReadAll(r); err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
}

// The same object read three times: the first read's bytes come from the store,
// the second's from the disk tier, the third's from the memory tier (which admits
// an entry on its second open from disk); each read's Tally says so, and the
// cache's totals are their sum.
func TestTallyByTier(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	data := randBytes(21, 300_000)
	size := int64(len(data))
	up.put(url, data, "v1")
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 22, MemoryBytes: 1 << 22}, up)
	var store, disk, memory Tally
	readTallied(t, c, url, &store)
	readTallied(t, c, url, &disk)
	readTallied(t, c, url, &memory)
	for _, tc := range []struct {
		name string
		got  Bytes
		want Bytes
	}{
		{"first read", store.Bytes(), Bytes{Store: size}},
		{"second read", disk.Bytes(), Bytes{Disk: size}},
		{"third read", memory.Bytes(), Bytes{Memory: size}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, tc.got, tc.want)
		}
	}
	if r := store.Bytes().HitRate(); r != 0 {
		t.Errorf("first read's hit rate %v, want 0", r)
	}
	if r := memory.Bytes().HitRate(); r != 1 {
		t.Errorf("third read's hit rate %v, want 1", r)
	}
	st := c.Stats()
	want := store.Bytes().Add(disk.Bytes()).Add(memory.Bytes())
	if st.Served() != want {
		t.Errorf("Stats.Served %+v, want the reads' sum %+v", st.Served(), want)
	}
	if st.BytesFetched != size || st.StoreBytes() != size {
		t.Errorf("Stats: fetched %d, from the store %d; want %d each", st.BytesFetched, st.StoreBytes(), size)
	}
	if want := 2.0 / 3; st.Served().HitRate() != want {
		t.Errorf("hit rate of all the reads %v, want %v", st.Served().HitRate(), want)
	}
}

// With a memory tier alone, the second read comes from memory.
func TestTallyMemoryOnly(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, randBytes(22, 70_000), "v1")
	c := newCache(t, Options{MemoryBytes: 1 << 20}, up)
	var first, second Tally
	readTallied(t, c, url, &first)
	readTallied(t, c, url, &second)
	if got := first.Bytes(); got != (Bytes{Store: 70_000}) {
		t.Errorf("first read %+v, want all from the store", got)
	}
	if got := second.Bytes(); got != (Bytes{Memory: 70_000}) {
		t.Errorf("second read %+v, want all from memory", got)
	}
}

// A read the cache cannot hold (the object is larger than the budget) goes around
// it, every time: its bytes are the store's.
func TestTallyBypassIsStore(t *testing.T) {
	up := newFake()
	const url = "s3://b/big.tar"
	up.put(url, randBytes(23, 200_000), "v1")
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 100_000}, up)
	for i := range 2 {
		var tl Tally
		readTallied(t, c, url, &tl)
		if got := tl.Bytes(); got != (Bytes{Store: 200_000}) {
			t.Errorf("read %d: %+v, want all from the store", i, got)
		}
	}
	if st := c.Stats(); st.BytesBypassed != 400_000 || st.BytesFetched != 0 || st.StoreBytes() != 400_000 {
		t.Errorf("Stats: bypassed %d, fetched %d; want 400000 and 0", st.BytesBypassed, st.BytesFetched)
	}
}

// A read the policy does not admit (its next use is further than that of every
// entry it would evict) goes around the cache: its bytes are the store's, and
// the reads of the entries kept are the disk tier's.
func TestTallyDeclinedIsStore(t *testing.T) {
	tr := newTrio()
	c := tr.cache(t, t.TempDir(), Options{})
	tr.fill(t, c)
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	hint(t, c, "job-a", []HintEntry{{x, tr.at(10 * time.Second)}, {y, tr.at(20 * time.Second)}, {z, tr.at(0)}, {z, tr.at(time.Minute)}})
	var zt, xt Tally
	readTallied(t, c, z, &zt)
	readTallied(t, c, x, &xt)
	if st := c.Stats(); st.Declined != 1 {
		t.Fatalf("declined %d, want 1", st.Declined)
	}
	if got, want := zt.Bytes(), (Bytes{Store: int64(len(tr.data[z]))}); got != want {
		t.Errorf("the declined read: %+v, want %+v", got, want)
	}
	if got, want := xt.Bytes(), (Bytes{Disk: int64(len(tr.data[x]))}); got != want {
		t.Errorf("the cached read: %+v, want %+v", got, want)
	}
}

// Two reads meet one fetch: the one that started it is served the store's bytes,
// the other joined it; the store sent the object once.
func TestTallyJoinedFetch(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"disk", Options{DiskBytes: 1 << 22}},
		{"memory", Options{MemoryBytes: 1 << 22}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			const url = "s3://b/a.tar"
			data := randBytes(24, 2<<20+5)
			size := int64(len(data))
			up.put(url, data, "v1")
			up.gate = make(chan struct{})
			if tc.opts.DiskBytes > 0 {
				tc.opts.Dir = t.TempDir()
			}
			c := newCache(t, tc.opts, up)
			var first, second Tally
			r1, err := c.Open(WithTally(t.Context(), &first), url)
			if err != nil {
				t.Fatal(err)
			}
			defer r1.Close()
			// The source sends nothing until the gate opens: the fetch is in flight.
			r2, err := c.Open(WithTally(t.Context(), &second), url)
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Close()
			close(up.gate)
			for _, r := range []io.Reader{r1, r2} {
				if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%d bytes, %v; want the object's %d", len(got), err, size)
				}
			}
			if got := first.Bytes(); got != (Bytes{Store: size}) {
				t.Errorf("the read that started the fetch: %+v, want all from the store", got)
			}
			if got := second.Bytes(); got != (Bytes{Joined: size}) {
				t.Errorf("the read that joined it: %+v, want all joined", got)
			}
			st := c.Stats()
			if st.BytesFetched != size || st.BytesJoined != size {
				t.Errorf("Stats: fetched %d, joined %d; want %d each", st.BytesFetched, st.BytesJoined, size)
			}
			if got := st.Served(); got != first.Bytes().Add(second.Bytes()) {
				t.Errorf("Stats.Served %+v, want the reads' sum", got)
			}
		})
	}
}

// Two reads of one Tally meet one fetch (a loader reading a shard's first sample
// for its fields, then the whole shard): the store's bytes count once, and
// nothing is joined.
func TestTallyOneReaderTwoOpens(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	data := randBytes(26, 1<<20+3)
	size := int64(len(data))
	up.put(url, data, "v1")
	up.gate = make(chan struct{})
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 22}, up)
	var tl Tally
	ctx := WithTally(t.Context(), &tl)
	var rs []io.ReadCloser
	for range 2 {
		r, err := c.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rs = append(rs, r)
	}
	close(up.gate)
	if _, err := io.ReadFull(rs[0], make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	rs[0].Close()
	if got, err := io.ReadAll(rs[1]); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("%d bytes, %v", len(got), err)
	}
	if got := tl.Bytes(); got != (Bytes{Store: size}) {
		t.Errorf("%v, want the object's %d bytes from the store, once", got, size)
	}
	if st := c.Stats(); st.Served() != tl.Bytes() || st.Joined != 1 {
		t.Errorf("Stats.Served %v, %d opens joined; want %v, 1", st.Served(), st.Joined, tl.Bytes())
	}
}

// openSignal is a source whose whole-object opens say so on opened, and whose
// streams wait for gate; its ranges are served at once.
type openSignal struct {
	*rangeFake
	opened chan struct{}
}

func (s *openSignal) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	r, err := s.rangeFake.Open(ctx, url)
	s.opened <- struct{}{}
	return r, err
}

// A range of an object not cached is read from the store (a range read) while the
// whole object is fetched in the background: that fetch counts for the range
// read's Tally, and a read of that Tally that opens the whole object while the
// fetch is in flight reads its own fetch; a read of another Tally joins it. The
// next read is the disk tier's.
func TestTallyFetchBehind(t *testing.T) {
	for _, same := range []bool{true, false} {
		fake := newFake()
		const url = "s3://b/a.tar"
		data := randBytes(25, 500_000)
		size := int64(len(data))
		fake.put(url, data, "v1")
		fake.gate = make(chan struct{})
		up := &openSignal{rangeFake: &rangeFake{fakeSource: fake}, opened: make(chan struct{}, 1)}
		c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 22}, up)
		var ranged, other Tally
		r, err := c.OpenRange(WithTally(t.Context(), &ranged), url, 1000, 500)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, data[1000:1500]) {
			t.Fatalf("range: %d bytes, %v", len(got), err)
		}
		r.Close()
		<-up.opened // the fetch behind is in flight, held at the gate
		whole := &ranged
		if !same {
			whole = &other
		}
		w, err := c.Open(WithTally(t.Context(), whole), url)
		if err != nil {
			t.Fatal(err)
		}
		close(fake.gate)
		if got, err := io.ReadAll(w); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("whole: %d bytes, %v", len(got), err)
		}
		w.Close()
		c.behindWG.Wait()
		if got := ranged.Bytes(); got != (Bytes{Store: 500 + size}) {
			t.Errorf("same Tally %v: the range read's %v, want %d bytes from the store", same, got, 500+size)
		}
		if want := (Bytes{Joined: size}); !same && other.Bytes() != want {
			t.Errorf("the other read's %v, want %v", other.Bytes(), want)
		}
		var next Tally
		readTallied(t, c, url, &next)
		if got := next.Bytes(); got != (Bytes{Disk: size}) {
			t.Errorf("the next read: %v, want all from disk", got)
		}
		if st := c.Stats(); st.Served() != ranged.Bytes().Add(other.Bytes()).Add(next.Bytes()) {
			t.Errorf("Stats.Served %v, want the reads' sum", st.Served())
		}
	}
}

func TestBytesString(t *testing.T) {
	b := Bytes{Memory: 2e6, Disk: 1e6, Store: 1e6}
	if got, want := b.String(), "4.0 MB read: 1.0 MB from the store, 2.0 MB from memory, 1.0 MB from disk (hit rate 75.0%)"; got != want {
		t.Errorf("String: %q, want %q", got, want)
	}
	if got := (Bytes{}).HitRate(); got != 0 {
		t.Errorf("hit rate of nothing: %v", got)
	}
	if got := b.Sub(Bytes{Memory: 1e6}); got.Memory != 1e6 || got.Total() != 3e6 {
		t.Errorf("Sub: %+v", got)
	}
}
