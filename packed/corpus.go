package packed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// DocsPerShard is the number of consecutive documents of a Megatron dataset that
// play the part of a shard in the order (the unit the order shuffles and reads side
// by side).
const DocsPerShard = 4096

// ErrNotPackable means a field or dataset cannot be packed: not 1-D integers, no
// member sizes in the index, a compressed shard.
var ErrNotPackable = errors.New("packed: not packable")

// ErrTokens means a document's tokens are not what the index says (another count),
// or a token id does not fit the output.
var ErrTokens = errors.New("packed: bad tokens")

// part is one shard of the order: a tar shard, or DocsPerShard documents of a
// Megatron .bin.
type part struct {
	url   string // the object read: a tar shard or a .bin
	obj   int    // the object's number: the parts of one .bin share it
	info  shard.Info
	first int // a Megatron part's first document in its index
	meg   *megatron.Index
	dtype string // a tar field's .npy descr
}

// corpus is an epoch's documents: the parts the order shuffles, and their reads.
type corpus struct {
	field string
	parts []part
	infos []shard.Info // the parts as the order sees them (URL, documents)
	from  []int        // from[i]: the first part of Config.URLs[i] (or Shards[i]); one more at the end
}

// tokens returns the token count of document k of part p.
func (c *corpus) tokens(p, k int) int64 {
	pt := &c.parts[p]
	if pt.meg != nil {
		return pt.meg.DocTokens(pt.first + k)
	}
	n, _ := pt.info.Members.Items(k, c.field)
	return n
}

// span returns the byte range of document k of part p in its object.
func (c *corpus) span(p, k int) (off, n int64) {
	pt := &c.parts[p]
	if pt.meg != nil {
		return pt.meg.DocRange(pt.first + k)
	}
	off = pt.info.Offsets[k]
	end := pt.info.Size
	if k+1 < len(pt.info.Offsets) {
		end = pt.info.Offsets[k+1]
	}
	return off, end - off
}

// end returns the end of part p's bytes in its object.
func (c *corpus) end(p int) int64 {
	if n := c.infos[p].Samples; c.parts[p].meg != nil && n > 0 {
		off, size := c.span(p, n-1)
		return off + size
	}
	return c.parts[p].info.Size
}

// openCorpus finds the documents of cfg's URLs, in order: Megatron datasets (URLs
// ending in .idx) and tar shards with member sizes (given as shards, or looked up
// in the index). c.from[i] is the first part of URL (or shard) i.
func openCorpus(ctx context.Context, cfg *Config) (*corpus, error) {
	c := &corpus{field: cfg.Pack.Field}
	infos := cfg.Shards
	var tarOf []int // per tar shard found from the URLs, its URL
	if len(infos) == 0 {
		var tarURLs []string
		for i, u := range cfg.URLs {
			if strings.HasSuffix(u, ".idx") {
				continue
			}
			urls, err := shard.ExpandAll([]string{u})
			if err == nil {
				urls, err = cfg.Sources.Expand(ctx, urls)
			}
			if err != nil {
				return nil, err
			}
			urls = index.Omit(urls)
			tarURLs = append(tarURLs, urls...)
			for range urls {
				tarOf = append(tarOf, i)
			}
		}
		if len(tarURLs) > 0 {
			lk := index.Lookup{Sources: cfg.Sources, Index: cfg.Index, WantMembers: true, Logf: cfg.Logf}
			var err error
			if infos, err = lk.Resolve(ctx, tarURLs); err != nil {
				return nil, err
			}
			if len(infos) != len(tarURLs) {
				return nil, fmt.Errorf("packed: the index gave %d entries for %d shards", len(infos), len(tarURLs))
			}
		}
	} else {
		for i := range infos {
			tarOf = append(tarOf, i)
		}
	}
	n := len(cfg.URLs)
	if len(cfg.Shards) > 0 {
		n = len(cfg.Shards)
	}
	c.from = make([]int, n+1)
	t := 0
	for i := range n {
		c.from[i] = len(c.parts)
		if len(cfg.Shards) == 0 && strings.HasSuffix(cfg.URLs[i], ".idx") {
			if err := c.addMegatron(ctx, cfg.Sources, cfg.URLs[i]); err != nil {
				return nil, err
			}
			continue
		}
		for ; t < len(infos) && tarOf[t] == i; t++ {
			if err := c.addTar(infos[t]); err != nil {
				return nil, err
			}
		}
	}
	c.from[n] = len(c.parts)
	return c, nil
}

// addTar adds the documents of the tar shard of in.
func (c *corpus) addTar(in shard.Info) error {
	u := redact.URL(in.URL)
	switch {
	case in.Samples > 0 && len(in.Offsets) != in.Samples:
		return fmt.Errorf("%w: %s has no sample offsets in its index (a compressed shard, or an index without offsets): a packed field is read by ranges of uncompressed shards; write the shards uncompressed and index them (shardload index)", ErrNotPackable, u)
	case in.Samples > 0 && in.Members == nil:
		return fmt.Errorf("%w: %s has no member sizes in its index: write one with this release (shardload index), which records each .npy member's dtype and length", ErrNotPackable, u)
	}
	dt := in.Members.DType(c.field)
	if in.Samples > 0 {
		if _, ok := npyItem(dt); !ok {
			return fmt.Errorf("%w: field %s of %s is not a 1-D integer .npy array in every sample (the index records dtype %q): a packed field holds one document of token ids per sample", ErrNotPackable, c.field, u, dt)
		}
	}
	c.parts = append(c.parts, part{url: in.URL, obj: len(c.parts), info: in, dtype: dt})
	c.infos = append(c.infos, shard.Info{URL: in.URL, Samples: in.Samples, Version: in.Version, Size: in.Size})
	return nil
}

// addMegatron adds the documents of the Megatron dataset of idxURL (X.idx, with
// X.bin beside it), in parts of DocsPerShard documents.
func (c *corpus) addMegatron(ctx context.Context, src *source.Registry, idxURL string) error {
	binURL := strings.TrimSuffix(idxURL, ".idx") + ".bin"
	bin, err := src.Stat(ctx, binURL)
	if err != nil {
		return fmt.Errorf("packed: the .bin of %s: %w", redact.URL(idxURL), err)
	}
	st, err := src.Stat(ctx, idxURL)
	if err != nil {
		return err
	}
	// The .idx is parsed as it is read, by ranges of idxChunk bytes: its arrays are
	// what planning needs, checked against its and the .bin's size before anything
	// is allocated from its counts, and kept flat (8 bytes a document as Megatron
	// writes them), never the file itself.
	r := &rangeReader{ctx: ctx, src: src, url: idxURL, version: st.Version, size: st.Size}
	meg, err := megatron.Parse(r, st.Size, bin.Size)
	if err != nil {
		return fmt.Errorf("packed: %s: %w", redact.URL(idxURL), err)
	}
	obj := len(c.parts)
	for first := 0; first < meg.Docs(); first += DocsPerShard {
		n := min(DocsPerShard, meg.Docs()-first)
		c.parts = append(c.parts, part{url: binURL, obj: obj, info: shard.Info{URL: binURL, Size: bin.Size, Version: bin.Version}, first: first, meg: meg})
		// The parts' names tell the order's dataset digest which documents they hold.
		c.infos = append(c.infos, shard.Info{URL: fmt.Sprintf("%s#docs=%d-%d", binURL, first, first+n), Samples: n, Version: bin.Version, Size: bin.Size})
	}
	return nil
}

// npyHeaderLen returns the length of the .npy header at the start of b (magic,
// version, header length and the header).
func npyHeaderLen(b []byte) (int64, bool) {
	if len(b) < 10 || string(b[:6]) != "\x93NUMPY" {
		return 0, false
	}
	if b[6] == 1 {
		return 10 + int64(binary.LittleEndian.Uint16(b[8:])), true
	}
	if len(b) < 12 {
		return 0, false
	}
	return 12 + int64(binary.LittleEndian.Uint32(b[8:])), true
}

// npyItem returns the element size of a .npy integer descr, and whether it is one.
func npyItem(descr string) (int, bool) {
	switch descr {
	case "|u1", "|i1":
		return 1, true
	case "<u2", "<i2":
		return 2, true
	case "<u4", "<i4":
		return 4, true
	case "<u8", "<i8":
		return 8, true
	}
	return 0, false
}

// npyTokens maps the .npy integer descrs that a Megatron dtype also holds to it.
var npyTokens = map[string]megatron.DType{
	"|u1": megatron.Uint8, "|i1": megatron.Int8, "<u2": megatron.Uint16, "<i2": megatron.Int16,
	"<i4": megatron.Int32, "<i8": megatron.Int64,
}

// appendNPY appends the little-endian integers of b, of descr, to dst.
func appendNPY(dst []int64, b []byte, descr string) ([]int64, error) {
	if dt, ok := npyTokens[descr]; ok {
		return megatron.AppendTokens(dst, b, dt)
	}
	switch descr {
	case "<u4":
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, int64(binary.LittleEndian.Uint32(b[i:])))
		}
	case "<i4":
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, int64(int32(binary.LittleEndian.Uint32(b[i:]))))
		}
	case "<i8":
		for i := 0; i+8 <= len(b); i += 8 {
			dst = append(dst, int64(binary.LittleEndian.Uint64(b[i:])))
		}
	case "<u8":
		for i := 0; i+8 <= len(b); i += 8 {
			v := binary.LittleEndian.Uint64(b[i:])
			if v > math.MaxInt64 {
				return dst, fmt.Errorf("token id %d does not fit int64", v)
			}
			dst = append(dst, int64(v))
		}
	default:
		return dst, fmt.Errorf("dtype %q is not an integer type", descr)
	}
	return dst, nil
}
