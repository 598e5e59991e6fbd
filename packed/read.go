package packed

// The read path: a planner goroutine cuts the rank's batches into groups, finds the
// byte ranges of the documents each group needs, merges them into chunks (one ranged
// read each), and hands the chunks to fetchers and the batches, in order, to fillers,
// which decode each piece's tokens from its chunk straight into the batch.

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/source"
)

// Sizes of the read path.
const (
	// maxChunk bounds a chunk (one ranged read) of several documents; a document
	// larger than it is a chunk of its own.
	maxChunk = 8 << 20
	// firstGroup is the bytes of the first group's new chunks; each next group's
	// doubles, up to a sixth of the chunks' budget (and maxGroup), so that the first
	// batch does not wait for a large read.
	firstGroup = 512 << 10
	maxGroup   = 64 << 20
	// DefaultFetches is Config.Fetches's default.
	DefaultFetches = 8
	// maxAhead bounds the read budget, the chunks read and not yet packed, below
	// half of Memory: enough to keep the fetchers busy on a store's latency, few
	// enough that their buffers are reused (a chunk's fresh buffer costs a page
	// fault every 4 KiB, more CPU than the read that fills it).
	maxAhead = 64 << 20
)

// chunk is one ranged read: bytes [off, off+len(buf)) of an object, which the
// batches that hold a reference to it decode their documents from.
type chunk struct {
	url string
	pt  *part // the object's part (its size and version)
	// docs is the bytes from off that its documents take; n is more when the chunk
	// reads ahead (see plan).
	docs int64
	off  int64
	n    int64
	buf  []byte
	err  error
	done chan struct{}
	refs atomic.Int32
	// queued: the planner has sent it to the fetchers (the planner's alone).
	queued bool
}

// loc is where a piece's document lies: its part and index, its bytes in the
// object, and the chunk that holds them.
type loc struct {
	ref
	off, n int64
	c      *chunk
}

// job is one batch to read and fill.
type job struct {
	seq    int64
	pad    int
	b      *Batch // the buffers it is filled in
	pieces []pack.Piece
	locs   []loc    // per piece; zero for pieces without document tokens
	chunks []*chunk // the distinct chunks the batch reads
	out    chan result
}

// reader is the read path's shared state.
type reader struct {
	l      *Loader
	budget *budget
	free   sync.Mutex
	bufs   [64][][]byte // chunk buffers to reuse, by size class (free)
	// freeBytes is the capacity of bufs, at most the budget's (free).
	freeBytes int64
	fetchq    chan *chunk
}

// start starts the planner, the fetchers and the fillers.
func (l *Loader) start(filler *pack.Filler, cur positions) {
	ctx, cancel := context.WithCancel(context.Background())
	rd := &reader{l: l, budget: newBudget(max(min(l.cfg.Memory/2, maxAhead), 1)), fetchq: make(chan *chunk, 1024)}
	l.rd = rd
	l.cancel = func() {
		cancel()
		rd.budget.cancel()
	}
	l.out = make(chan chan result, l.cfg.ReadAhead)
	l.closed = make(chan struct{})
	l.pool = make(chan *Batch, l.cfg.ReadAhead+2)
	jobs := make(chan *job)
	planned := make(chan *job, 1<<14)
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		defer close(planned)
		defer close(rd.fetchq)
		rd.plan(ctx, cur, planned)
	}()
	// The emitter hands the planned batches to Next and the fillers in order, as
	// Next takes them; the planner runs ahead of it as far as the budget allows.
	go func() {
		defer l.wg.Done()
		defer close(l.out)
		defer close(jobs)
		for j := range planned {
			select {
			case l.out <- j.out:
			case <-ctx.Done():
				return
			}
			// The buffers are taken here, in the batches' order, so that a consumer's
			// ring of them is never all held by batches behind one that waits.
			b, err := l.buffers().Get(ctx)
			if err != nil {
				j.out <- result{err: err}
				return
			}
			j.b = b
			select {
			case jobs <- j:
			case <-ctx.Done():
				l.Release(b)
				return
			}
		}
	}()
	for range l.cfg.Fetches {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for c := range rd.fetchq {
				rd.fetch(ctx, c)
			}
		}()
	}
	for range max(1, min(l.cfg.ReadAhead, runtime.GOMAXPROCS(0))) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			f := *filler // each filler its own scratch
			for j := range jobs {
				b, err := rd.fill(ctx, &f, j)
				j.out <- result{b, err}
				rd.budget.emitted(-1)
			}
		}()
	}
}

// plan makes the rank's batches' jobs, group by group, and their chunks.
func (rd *reader) plan(ctx context.Context, cur positions, jobs chan<- *job) {
	l := rd.l
	c := l.c
	target := int64(firstGroup)
	limit := min(rd.budget.max/6, maxGroup)
	var recent []*chunk // the last group's chunks, which the next may read from too
	var group []*job
	var want []*loc
	var walk pack.Walk
	ahead := min(rd.budget.max/int64(2*max(l.cfg.OpenShards, 1)), maxChunk)
	nb := l.deal.BatchesPerRank()
	for b := int64(0); b < nb; {
		// A group: batches whose documents not in a recent chunk take target bytes.
		group, want = group[:0], want[:0]
		var need int64
		for b < nb && (len(group) == 0 || need < target) {
			from, to, pad := l.deal.RowsOf(l.cfg.Rank, b)
			l.memo.start()
			j := &job{seq: b, pad: pad, pieces: l.layout.WalkPieces(&walk, from, to, nil), out: make(chan result, 1)}
			j.locs = make([]loc, len(j.pieces))
			refs := l.memo.take(j.pieces)
			for i, p := range j.pieces {
				if p.DocTokens() == 0 {
					continue
				}
				r, ok := refs(p.Doc)
				if !ok {
					r.p, r.k = cur.at(int64(p.Doc))
				}
				off, n := c.span(r.p, r.k)
				lc := &j.locs[i]
				*lc = loc{ref: r, off: off, n: n}
				if lc.c = covering(recent, c.parts[r.p].url, off, n); lc.c == nil {
					want = append(want, lc)
					need += n
				}
			}
			group = append(group, j)
			b++
		}
		// The documents not yet read, merged into chunks: runs of one object whose
		// gaps are at most ReadGap bytes, up to maxChunk bytes a chunk.
		slices.SortStableFunc(want, func(x, y *loc) int {
			return cmp.Or(cmp.Compare(c.parts[x.p].obj, c.parts[y.p].obj), cmp.Compare(x.off, y.off))
		})
		for i := 0; i < len(want); {
			pt := &c.parts[want[i].p]
			ch := &chunk{url: pt.url, pt: pt, off: want[i].off, n: want[i].n, done: make(chan struct{})}
			e := i
			for ; e < len(want) && c.parts[want[e].p].obj == pt.obj; e++ {
				w := want[e]
				end := ch.off + ch.n
				if w.off+w.n <= end {
					w.c = ch
					continue
				}
				if e > i && (w.off-end > l.cfg.ReadGap || w.off+w.n-ch.off > maxChunk) {
					break
				}
				ch.n = w.off + w.n - ch.off
				w.c = ch
			}
			// Read ahead, past the group's documents towards the part's end: a lane
			// reads its part in order, so the next group finds its documents in this
			// chunk (covering) and a part is a few requests, not one a group. Ahead
			// are at most the lane's share of half the budget, and nothing when the
			// budget is spent (see acquireAhead).
			ch.docs = ch.n
			ch.n = max(ch.n, min(c.end(want[e-1].p)-ch.off, ch.n+ahead, maxChunk))
			i = e
		}
		// References: one per batch that reads a chunk, and the planner's on this
		// group's chunks until the next group is planned.
		var next []*chunk
		for _, j := range group {
			for i := range j.locs {
				if ch := j.locs[i].c; ch != nil && !slices.Contains(j.chunks, ch) {
					j.chunks = append(j.chunks, ch)
					ch.refs.Add(1)
					if !slices.Contains(next, ch) {
						next = append(next, ch)
					}
				}
			}
		}
		for _, ch := range next {
			ch.refs.Add(1)
		}
		for _, ch := range recent {
			rd.unref(ch)
		}
		recent = next
		// The batches, each once the chunks it reads are on their way: a chunk is
		// read when the first batch that needs it is next.
		for _, j := range group {
			for _, ch := range j.chunks {
				if ch.queued {
					continue
				}
				ch.queued = true
				n, err := rd.budget.acquireAhead(ch.docs, ch.n)
				if err != nil {
					return
				}
				ch.n = n
				select {
				case rd.fetchq <- ch:
				case <-ctx.Done():
					return
				}
			}
			rd.budget.emitted(1)
			select {
			case jobs <- j:
			case <-ctx.Done():
				return
			}
		}
		target = min(2*target, limit)
	}
	for _, ch := range recent {
		rd.unref(ch)
	}
}

// memo keeps the documents a layout's length function was asked for while one
// batch's pieces were made (from their block's first document on, in order), so
// that the planner finds the pieces' documents without asking the order again.
type memo struct {
	on    bool
	first int
	refs  []ref
}

// start starts recording.
func (m *memo) start() { m.on, m.refs = true, m.refs[:0] }

// add records that document i is r.
func (m *memo) add(i int, r ref) {
	if !m.on {
		return
	}
	if len(m.refs) == 0 {
		m.first = i
	}
	if i == m.first+len(m.refs) {
		m.refs = append(m.refs, r)
	}
}

// take stops recording and returns a lookup of what was recorded.
func (m *memo) take(_ []pack.Piece) func(doc int) (ref, bool) {
	m.on = false
	return func(doc int) (ref, bool) {
		if i := doc - m.first; i >= 0 && i < len(m.refs) {
			return m.refs[i], true
		}
		return ref{}, false
	}
}

// covering returns the chunk of chunks that holds bytes [off, off+n) of url.
func covering(chunks []*chunk, url string, off, n int64) *chunk {
	for _, c := range chunks {
		if c.url == url && off >= c.off && off+n <= c.off+c.n {
			return c
		}
	}
	return nil
}

// fetch reads chunk c.
func (rd *reader) fetch(ctx context.Context, c *chunk) {
	defer close(c.done)
	c.buf = rd.buffer(c.n)
	// One request, pinned to the version the index (or the .bin's Stat) recorded.
	info := source.Info{URL: c.url, Size: c.pt.info.Size, Version: c.pt.info.Version}
	rc, err := rd.l.cfg.Sources.OpenInfoRange(ctx, info, c.off, c.n)
	if err != nil {
		c.err = err
		return
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, c.buf); err != nil {
		c.err = fmt.Errorf("packed: %s bytes %d to %d: %w", redact.URL(c.url), c.off, c.off+c.n, err)
	}
}

// buffer returns a buffer of n bytes, reusing a released chunk's of its size class
// (a power of two).
func (rd *reader) buffer(n int64) []byte {
	class := bits.Len64(uint64(max(n, 4096) - 1))
	rd.free.Lock()
	if k := len(rd.bufs[class]); k > 0 {
		b := rd.bufs[class][k-1]
		rd.bufs[class] = rd.bufs[class][:k-1]
		rd.freeBytes -= int64(cap(b))
		rd.free.Unlock()
		return b[:n]
	}
	rd.free.Unlock()
	return make([]byte, n, 1<<class)
}

// recycle keeps b for a later chunk of its size class.
func (rd *reader) recycle(b []byte) {
	class := bits.Len64(uint64(cap(b)) - 1)
	if 1<<class != cap(b) {
		return
	}
	rd.free.Lock()
	if rd.freeBytes+int64(cap(b)) <= rd.budget.max {
		rd.bufs[class] = append(rd.bufs[class], b)
		rd.freeBytes += int64(cap(b))
	}
	rd.free.Unlock()
}

// unref drops a reference to c; the last returns its bytes to the budget.
func (rd *reader) unref(c *chunk) {
	if c.refs.Add(-1) != 0 {
		return
	}
	<-c.done
	rd.budget.release(c.n)
	if c.buf != nil {
		rd.recycle(c.buf)
		c.buf = nil
	}
}

// fill waits for job j's chunks and fills its batch. On an error the batch's
// buffers go back (Release).
func (rd *reader) fill(ctx context.Context, f *pack.Filler, j *job) (_ *Batch, err error) {
	defer func() {
		for _, c := range j.chunks {
			rd.unref(c)
		}
		if err != nil {
			rd.l.Release(j.b)
		}
	}()
	for _, c := range j.chunks {
		select {
		case <-c.done:
		case <-ctx.Done():
			// unref waits for the fetch, which the cancel ends.
			return nil, ctx.Err()
		}
		if c.err != nil {
			return nil, c.err
		}
	}
	b := j.b
	b.Seq, b.Padded = j.seq, j.pad
	i := 0 // the piece Fill asks for: it asks in order
	var last int = -1
	var data []byte // the document's token bytes
	// locate returns piece p's document: its loc and its token bytes.
	locate := func(p pack.Piece) (*loc, error) {
		for j.pieces[i] != p {
			i++
		}
		lc := &j.locs[i]
		if p.Doc != last {
			var err error
			if data, err = rd.l.c.tokenBytes(lc.p, lc.k, lc.c.buf[lc.off-lc.c.off:lc.off-lc.c.off+lc.n], lc.off); err != nil {
				return nil, err
			}
			last = p.Doc
		}
		return lc, nil
	}
	tokens := func(p pack.Piece, dst []int64) error {
		lc, err := locate(p)
		if err != nil {
			return err
		}
		return rd.l.c.decodeInto(dst, lc.p, lc.k, data, p.From, lc.off)
	}
	var tokens32 func(p pack.Piece, dst []int32) (bool, error)
	if rd.l.cfg.Int32 {
		tokens32 = func(p pack.Piece, dst []int32) (bool, error) {
			lc, err := locate(p)
			if err != nil {
				return false, err
			}
			return rd.l.c.decodeInto32(dst, lc.p, lc.k, data, p.From, lc.off)
		}
	}
	err = f.FillWith(&b.Batch, j.pieces, tokens, tokens32)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// tokenBytes returns the bytes of document k of part p's tokens, of b, the
// document's bytes (the sample's, or the document's in a .bin) at byte offset off
// of the object, checked against the index.
func (c *corpus) tokenBytes(p, k int, b []byte, off int64) ([]byte, error) {
	pt := &c.parts[p]
	if pt.meg != nil {
		if size := int64(pt.meg.DType().Size()); int64(len(b)) != c.tokens(p, k)*size {
			return nil, fmt.Errorf("%w: %s: field %s: %d bytes for %d tokens of %s", ErrTokens, c.where(p, k, off), c.field, len(b), c.tokens(p, k), pt.meg.DType())
		}
		return b, nil
	}
	data, err := c.tarData(pt, b, c.tokens(p, k))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: field %s: %w", ErrTokens, c.where(p, k, off), c.field, err)
	}
	return data, nil
}

// where names document k of part p at byte off of its object.
func (c *corpus) where(p, k int, off int64) string {
	pt := &c.parts[p]
	if pt.meg != nil {
		return fmt.Sprintf("%s document %d (byte %d)", redact.URL(pt.url), pt.first+k, off)
	}
	return fmt.Sprintf("%s sample %d (byte %d)", redact.URL(pt.url), k, off)
}

// tarData returns the elements of the packed field's .npy member of the sample whose
// tar bytes are b, which its index says are items elements.
func (c *corpus) tarData(pt *part, b []byte, items int64) ([]byte, error) {
	at, size, ok := plainMember(b, c.field)
	if !ok {
		var err error
		if at, size, err = c.tarMember(b); err != nil {
			return nil, err
		}
	}
	data := b[at : at+size]
	isz, _ := npyItem(pt.dtype)
	// The elements are the member's last bytes: its header is what comes before.
	if items*int64(isz) > int64(len(data)) {
		return nil, fmt.Errorf("a .npy member of %d bytes cannot hold the %d elements its index says", len(data), items)
	}
	head := int64(len(data)) - items*int64(isz)
	if n, ok := npyHeaderLen(data); !ok || n != head {
		return nil, fmt.Errorf("its .npy member of %d bytes does not hold the %d elements of %s its index says (a header of %d bytes; the shard changed since it was indexed: rebuild the index)", len(data), items, pt.dtype, n)
	}
	return data[head:], nil
}

// plainMember finds the member of extension field in a sample's tar bytes b whose
// headers are plain ustar or v7 ones (regular files, names of up to 100 bytes with
// a ustar prefix, octal sizes): its data's offset and size. ok is false for
// anything else (PAX or GNU records, a bad checksum), which archive/tar then reads.
func plainMember(b []byte, field string) (at, size int64, ok bool) {
	for off := int64(0); off+512 <= int64(len(b)); {
		h := b[off : off+512]
		if h[0] == 0 {
			return 0, 0, false
		}
		switch h[156] {
		case '0', 0, '7':
		default:
			return 0, 0, false
		}
		n, ok := octal(h[124:136])
		if !ok || !checksum(h) {
			return 0, 0, false
		}
		// A ustar prefix holds directories only: the base name is in the name.
		if fieldIs(cstr(h[0:100]), field) {
			if n > int64(len(b))-off-512 {
				return 0, 0, false
			}
			return off + 512, n, true
		}
		off += 512 + (n+511)/512*512
	}
	return 0, 0, false
}

// cstr returns b up to its first NUL.
func cstr(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// octal parses a tar header's octal number field.
func octal(b []byte) (int64, bool) {
	b = bytes.Trim(cstr(b), " ")
	if len(b) == 0 || len(b) > 11 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v<<3 | int64(c-'0')
	}
	return v, true
}

// checksum reports whether tar header h's checksum holds (unsigned sum, the
// checksum field counted as spaces).
func checksum(h []byte) bool {
	want, ok := octal(h[148:156])
	if !ok {
		return false
	}
	return headerSum(h) == want
}

// headerSum is a tar header's unsigned checksum: the sum of its 512 bytes, the
// checksum field's 8 counted as spaces. It adds eight bytes at a time, in 16-bit
// lanes (64 words of 2 bytes at most 255 each stay below 2^16).
func headerSum(h []byte) int64 {
	h = h[:512]
	const lo = 0x00ff00ff00ff00ff
	var lanes uint64
	for i := 0; i < 512; i += 8 {
		w := binary.LittleEndian.Uint64(h[i:])
		if i == 144 { // bytes 148 to 151 of the checksum field
			w = w&0x00000000ffffffff | 0x2020202000000000
		} else if i == 152 { // bytes 152 to 155
			w = w&0xffffffff00000000 | 0x0000000020202020
		}
		lanes += w&lo + w>>8&lo
	}
	var sum int64
	for ; lanes != 0; lanes >>= 16 {
		sum += int64(lanes & 0xffff)
	}
	return sum
}

// tarMember finds the member of the packed field in a sample's tar bytes b with
// archive/tar: its data's offset and size.
func (c *corpus) tarMember(b []byte) (at, size int64, err error) {
	br := bytes.NewReader(b)
	tr := tar.NewReader(br)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return 0, 0, fmt.Errorf("no member %s in the sample", c.field)
		}
		if err != nil {
			return 0, 0, err
		}
		if !fieldIs(h.Name, c.field) {
			continue
		}
		at := int64(len(b)) - int64(br.Len()) // the member's first byte
		if h.Size > int64(len(b))-at {
			return 0, 0, fmt.Errorf("a member of %d bytes past the sample's end", h.Size)
		}
		return at, h.Size, nil
	}
}

// fieldIs reports whether the member name's extension (after the first dot of its
// base name) is field.
func fieldIs[S string | []byte](name S, field string) bool {
	base := name
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			base = name[i+1:]
			break
		}
	}
	for i := 0; i < len(base); i++ {
		if base[i] == '.' {
			return string(base[i+1:]) == field
		}
	}
	return false
}

// decodeInto writes len(dst) tokens of document k of part p, from token from on, of
// its token bytes data (at byte off of the object).
func (c *corpus) decodeInto(dst []int64, p, k int, data []byte, from, off int64) error {
	pt := &c.parts[p]
	var size int
	if pt.meg != nil {
		size = pt.meg.DType().Size()
	} else {
		size, _ = npyItem(pt.dtype)
	}
	b := data[from*int64(size) : (from+int64(len(dst)))*int64(size)]
	var got []int64
	var err error
	if pt.meg != nil {
		got, err = megatron.AppendTokens(dst[:0], b, pt.meg.DType())
	} else {
		got, err = appendNPY(dst[:0], b, pt.dtype)
	}
	if err == nil && (len(got) != len(dst) || len(got) > 0 && &got[0] != &dst[0]) {
		err = fmt.Errorf("decoded %d tokens, want %d", len(got), len(dst))
	}
	if err != nil {
		return fmt.Errorf("%w: %s: field %s: %w", ErrTokens, c.where(p, k, off), c.field, err)
	}
	return nil
}

// decodeInto32 is decodeInto for int32 ids, where the document's dtype holds only
// ids an int32 holds (megatron.AppendTokens32); false: decodeInto, and a check of
// each id, are the caller's.
func (c *corpus) decodeInto32(dst []int32, p, k int, data []byte, from, off int64) (bool, error) {
	pt := &c.parts[p]
	dt, ok := npyTokens[pt.dtype]
	if pt.meg != nil {
		dt, ok = pt.meg.DType(), true
	}
	if !ok {
		return false, nil
	}
	size := int64(dt.Size())
	b := data[from*size : (from+int64(len(dst)))*size]
	got, done, err := megatron.AppendTokens32(dst[:0], b, dt)
	if err == nil && done && (len(got) != len(dst) || len(got) > 0 && &got[0] != &dst[0]) {
		err = fmt.Errorf("decoded %d tokens, want %d", len(got), len(dst))
	}
	if err != nil {
		return false, fmt.Errorf("%w: %s: field %s: %w", ErrTokens, c.where(p, k, off), c.field, err)
	}
	return done, nil
}

// buffers returns Config.Buffers, or the loader's own.
func (l *Loader) buffers() Buffers {
	if l.cfg.Buffers != nil {
		return l.cfg.Buffers
	}
	return (*ownBuffers)(l)
}

// ownBuffers are the loader's own buffers: released batches, else new ones.
type ownBuffers Loader

// Get returns a released batch's buffers, or new ones.
func (o *ownBuffers) Get(context.Context) (*Batch, error) {
	l := (*Loader)(o)
	select {
	case b := <-l.pool:
		b.Padded, b.MaxSeqlen = 0, 0
		b.CuSeqlens = b.CuSeqlens[:cap(b.CuSeqlens)]
		return b, nil
	default:
	}
	rows := l.cfg.BatchSize * l.cfg.Pack.SeqLen
	b := &Batch{}
	b.PositionIDs = make([]int64, rows)
	b.CuSeqlens = make([]int32, rows+1)
	if l.cfg.Int32 {
		b.InputIDs32 = make([]int32, rows)
	} else {
		b.InputIDs = make([]int64, rows)
	}
	return b, nil
}

// Put keeps b for a later batch, or leaves it to the garbage collector.
func (o *ownBuffers) Put(b *Batch) {
	select {
	case o.pool <- b:
	default:
	}
}

// Release gives a batch's buffers back to Config.Buffers, or to the loader, which
// fills later batches in them: the caller must not use b after. A batch of the
// loader's own not released is left to the garbage collector, as any value.
func (l *Loader) Release(b *Batch) {
	if b != nil {
		l.buffers().Put(b)
	}
}
