// Package shardgen writes synthetic WebDataset shards for tests, benchmarks and the
// demo. Output is a pure function of the Spec: the same seed gives the same bytes.
package shardgen

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/shard"
)

// Kind says what a field's bytes look like.
type Kind int

// Field kinds.
const (
	// Random bytes: incompressible, like encoded images.
	Random Kind = iota
	// Class is a decimal integer label, as in WebDataset's .cls members.
	Class
	// Text is compressible ASCII words.
	Text
	// Tokens is a 1-D little-endian int32 .npy array of Field.Tokens token ids drawn
	// from a skewed distribution over a 50257-word vocabulary, like tokenized text.
	Tokens
	// Document is a pre-tokenized document to pack: a 1-D little-endian uint16 .npy
	// array of a length drawn uniformly in [Field.MinTokens, Field.MaxTokens], of
	// token ids in [FirstToken, Field.Vocab): each drawn from a skewed distribution,
	// or (after the first, one time in two) its predecessor's next id, wrapping, so
	// that a language model has something to learn. The ids below FirstToken (0 and
	// 1) are left for a pad and an eos.
	Document
	// JSON is a JSON object holding a number and Text of about MinBytes to MaxBytes.
	JSON
)

// FirstToken is the smallest token id of a Document: 0 and 1 are no document's, so
// that a packing spec can take them as pad and eos.
const FirstToken = 2

// Field describes one member of every sample.
type Field struct {
	Ext      string
	Kind     Kind
	MinBytes int // for Random and Text: size drawn uniformly in [MinBytes, MaxBytes]
	MaxBytes int
	Tokens   int // for Tokens: the array length
	// For Document: the length is drawn uniformly in [MinTokens, MaxTokens] (at
	// least 1), the ids in [FirstToken, Vocab) (Vocab at most 65536).
	MinTokens, MaxTokens int
	Vocab                int
}

// Presets are named datasets for benchmarks and the demo; Spec.Fields takes them.
var Presets = map[string][]Field{
	// Captioned images: a random "jpg" of 16-48 KiB, a label and a caption.
	"default": nil,
	// ImageNet-like: a random "jpg" of 100-120 KB (about 110 KB) and a label.
	"images": {{Ext: "jpg", Kind: Random, MinBytes: 100_000, MaxBytes: 120_000}, {Ext: "cls", Kind: Class}},
	// Pre-tokenized text: 2048 int32 tokens as .npy (8 KiB) and a label.
	"tokens": {{Ext: "npy", Kind: Tokens, Tokens: 2048}, {Ext: "cls", Kind: Class}},
	// Documents to pack into rows for a language model: one "tokens.npy" member per
	// sample, 1 to 1024 uint16 token ids in [2, 1024) (0 and 1 left for pad and eos),
	// as "--pack tokens.npy:SEQ_LEN:eos=1:pad=0" reads them from uncompressed shards.
	"docs": {{Ext: "tokens.npy", Kind: Document, MinTokens: 1, MaxTokens: 1024, Vocab: 1024}},
}

// Spec describes a synthetic dataset. Zero fields take the defaults in Defaults.
type Spec struct {
	Shards          int
	SamplesPerShard int
	Fields          []Field
	Compression     shard.Compression // None, Gzip or Zstd
	Seed            uint64
	Prefix          string // file name prefix, default "train"
	// KeyPrefixes, when more than 1, puts each shard in a directory of its own
	// hashed key prefix, shard.HashPrefix(Name(i), KeyPrefixes): Path and Pattern
	// say "{hash:P}/" before the name. 0 or 1: every shard directly in the dataset's
	// directory.
	KeyPrefixes int
	// Samples, when set, gives shard i Samples[i%len(Samples)] samples instead of
	// SamplesPerShard, for datasets with uneven shards.
	Samples []int
}

// SamplesIn returns the number of samples of shard i.
func (s Spec) SamplesIn(i int) int {
	if len(s.Samples) > 0 {
		return s.Samples[i%len(s.Samples)]
	}
	return s.Defaults().SamplesPerShard
}

// Defaults fills the zero fields of s: 4 shards of 256 samples, each a random
// "jpg" of 16 to 48 KiB, a "cls" label and a short "txt" caption; prefix "train".
func (s Spec) Defaults() Spec {
	if s.Shards == 0 {
		s.Shards = 4
	}
	if s.SamplesPerShard == 0 {
		s.SamplesPerShard = 256
	}
	if len(s.Fields) == 0 {
		s.Fields = []Field{
			{Ext: "jpg", Kind: Random, MinBytes: 16 << 10, MaxBytes: 48 << 10},
			{Ext: "cls", Kind: Class},
			{Ext: "txt", Kind: Text, MinBytes: 40, MaxBytes: 200},
		}
	}
	if s.Prefix == "" {
		s.Prefix = "train"
	}
	return s
}

// Name returns the file name of shard i, e.g. "train-000003.tar.zst".
func (s Spec) Name(i int) string {
	s = s.Defaults()
	ext := ".tar"
	switch s.Compression {
	case shard.Gzip:
		ext += ".gz"
	case shard.Zstd:
		ext += ".zst"
	}
	return fmt.Sprintf("%s-%06d%s", s.Prefix, i, ext)
}

// Path returns the path of shard i relative to the dataset's directory: its Name, in
// the directory of its hashed key prefix when KeyPrefixes is more than 1, e.g.
// "3/train-000003.tar".
func (s Spec) Path(i int) string {
	name := s.Name(i)
	if s.KeyPrefixes > 1 {
		return shard.HashPrefix(name, s.KeyPrefixes) + "/" + name
	}
	return name
}

// Pattern returns the brace pattern naming all shards, e.g. "train-{000000..000003}.tar",
// or "{hash:16}/train-{000000..000003}.tar" over 16 key prefixes.
func (s Spec) Pattern() string {
	s = s.Defaults()
	first, last := s.Name(0), s.Name(s.Shards-1)
	n := len(s.Prefix) + 1
	p := first[:n] + "{" + first[n:n+6] + ".." + last[n:n+6] + "}" + first[n+6:]
	if s.KeyPrefixes > 1 {
		p = fmt.Sprintf("{hash:%d}/%s", s.KeyPrefixes, p)
	}
	return p
}

// Key returns the key of sample j of shard i.
func Key(i, j int) string { return fmt.Sprintf("s%06d-%06d", i, j) }

// WriteShard writes shard i of s to w.
func WriteShard(w io.Writer, s Spec, i int) error {
	s = s.Defaults()
	var (
		out io.Writer = w
		zc  io.WriteCloser
	)
	switch s.Compression {
	case shard.None:
	case shard.Gzip:
		zc = gzip.NewWriter(w)
	case shard.Zstd:
		z, err := zstd.NewWriter(w, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return err
		}
		zc = z
	default:
		return fmt.Errorf("shardgen: cannot write %s shards", s.Compression)
	}
	if zc != nil {
		out = zc
	}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], s.Seed)
	binary.LittleEndian.PutUint64(seed[8:], uint64(i))
	rng := rand.New(rand.NewChaCha8(seed)) // sizes, labels, words
	seed[16] = 1
	chacha := rand.NewChaCha8(seed) // payload bytes
	tw := tar.NewWriter(out)
	buf := make([]byte, 0, 64<<10)
	for j := 0; j < s.SamplesIn(i); j++ {
		key := Key(i, j)
		for _, f := range s.Fields {
			buf = fieldBytes(buf[:0], f, rng, chacha)
			hdr := &tar.Header{Name: key + "." + f.Ext, Mode: 0o644, Size: int64(len(buf)),
				ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg, Format: tar.FormatUSTAR}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(buf); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if zc != nil {
		return zc.Close()
	}
	return nil
}

var words = []string{"a", "photo", "of", "the", "small", "red", "dog", "on", "grass", "with", "blue", "sky", "cat", "tree"}

func fieldBytes(buf []byte, f Field, rng *rand.Rand, chacha *rand.ChaCha8) []byte {
	size := f.MinBytes
	if f.MaxBytes > f.MinBytes {
		size += rng.IntN(f.MaxBytes - f.MinBytes + 1)
	}
	switch f.Kind {
	case Class:
		return fmt.Appendf(buf, "%d", rng.IntN(1000))
	case Tokens:
		return appendTokens(buf, f.Tokens, rng)
	case Document:
		return appendDocument(buf, f, rng)
	case JSON:
		buf = fmt.Appendf(buf, `{"n":%d,"text":"`, rng.IntN(1000))
		for len(buf) < size {
			buf = append(buf, words[rng.IntN(len(words))]...)
			buf = append(buf, ' ')
		}
		return append(buf, `"}`...)
	case Text:
		for len(buf) < size {
			buf = append(buf, words[rng.IntN(len(words))]...)
			buf = append(buf, ' ')
		}
		return buf[:size]
	default:
		buf = slices.Grow(buf, size)[:size]
		chacha.Read(buf)
		return buf
	}
}

// appendTokens appends a .npy (version 1.0) of n little-endian int32 token ids.
func appendTokens(buf []byte, n int, rng *rand.Rand) []byte {
	buf = appendNPYHeader(buf, "<i4", n)
	for range n {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(int(rng.ExpFloat64()*3000)%50257))
	}
	return buf
}

// appendNPYHeader appends the header of a version 1.0 .npy file holding a 1-D array
// of n elements of type descr.
func appendNPYHeader(buf []byte, descr string, n int) []byte {
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", descr, n)
	// The magic, version, header length and header are padded to a multiple of 64.
	total := 10 + len(header) + 1
	pad := (64 - total%64) % 64
	buf = append(buf, "\x93NUMPY\x01\x00"...)
	buf = binary.LittleEndian.AppendUint16(buf, uint16(len(header)+pad+1))
	buf = append(buf, header...)
	for range pad {
		buf = append(buf, ' ')
	}
	return append(buf, '\n')
}

// appendDocument appends a .npy (version 1.0) of a Document field's uint16 token ids.
func appendDocument(buf []byte, f Field, rng *rand.Rand) []byte {
	lo, hi := max(f.MinTokens, 1), f.MaxTokens
	n := lo
	if hi > lo {
		n += rng.IntN(hi - lo + 1)
	}
	buf = appendNPYHeader(buf, "<u2", n)
	span := min(max(f.Vocab, FirstToken+1), 1<<16) - FirstToken
	// The first eighth of the ids carries most of the mass.
	scale := float64(span) / 8
	id := 0 // the last id, less FirstToken
	for i := range n {
		if i == 0 || rng.IntN(2) == 0 {
			id = int(rng.ExpFloat64()*scale) % span
		} else {
			id = (id + 1) % span
		}
		buf = binary.LittleEndian.AppendUint16(buf, uint16(FirstToken+id))
	}
	return buf
}

// Generate writes every shard of s into dir (created if needed), each at its Path
// (its key prefix's directory created too), and returns their paths. Each file is
// written to a temporary name and renamed when complete.
func Generate(dir string, s Spec) ([]string, error) {
	s = s.Defaults()
	if s.KeyPrefixes > shard.MaxHashPrefixes {
		return nil, fmt.Errorf("shardgen: %d key prefixes: at most %d", s.KeyPrefixes, shard.MaxHashPrefixes)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	paths := make([]string, 0, s.Shards)
	made := map[string]bool{}
	for i := 0; i < s.Shards; i++ {
		p := filepath.Join(dir, filepath.FromSlash(s.Path(i)))
		if d := filepath.Dir(p); !made[d] {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
			made[d] = true
		}
		if err := writeFile(p, s, i); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func writeFile(path string, s Spec, i int) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".shardgen-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := WriteShard(bw, s, i); err != nil {
		tmp.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
