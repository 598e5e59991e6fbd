// Command packgen writes the token datasets scripts/bench-pack.sh measures: tar
// shards of token documents (each sample one tokens.npy member, a 1-D uint16 array of
// a random length) or a Megatron indexed dataset (X.idx and X.bin, uint16) of the
// same kind of documents. The same arguments give the same bytes.
//
//	packgen tar DIR SHARDS DOCS_PER_SHARD MIN_LEN MAX_LEN
//	packgen megatron PREFIX DOCS MIN_LEN MAX_LEN
package main

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shardload/shardload/megatron"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "packgen:", err)
		os.Exit(1)
	}
}

func ints(args []string) ([]int, error) {
	var v []int
	for _, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q", a)
		}
		v = append(v, n)
	}
	return v, nil
}

func run(args []string) error {
	rng := rand.New(rand.NewPCG(1, 2))
	switch {
	case len(args) == 6 && args[0] == "tar":
		v, err := ints(args[2:])
		if err != nil {
			return err
		}
		return writeTar(rng, args[1], v[0], v[1], v[2], v[3])
	case len(args) == 5 && args[0] == "megatron":
		v, err := ints(args[2:])
		if err != nil {
			return err
		}
		return writeMegatron(rng, args[1], v[0], v[1], v[2])
	}
	return fmt.Errorf("usage: packgen tar DIR SHARDS DOCS_PER_SHARD MIN_LEN MAX_LEN | packgen megatron PREFIX DOCS MIN_LEN MAX_LEN")
}

// doc returns a document of MIN_LEN..MAX_LEN tokens in 1..65535 (0 is the eos).
func doc(rng *rand.Rand, dst []int64, lo, hi int) []int64 {
	n := lo + rng.IntN(hi-lo+1)
	dst = dst[:0]
	for range n {
		dst = append(dst, 1+int64(rng.IntN(65535)))
	}
	return dst
}

// npy frames uint16 tokens as a version 1.0 .npy file, as numpy writes it.
func npy(dst []byte, tokens []int64) []byte {
	h := "{'descr': '<u2', 'fortran_order': False, 'shape': (" + strconv.Itoa(len(tokens)) + ",), }"
	h += strings.Repeat(" ", 21-len(strconv.Itoa(len(tokens))))
	hlen := len(h) + 1
	pad := 64 - (10+hlen)%64
	dst = append(dst[:0], "\x93NUMPY\x01\x00"...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(hlen+pad))
	dst = append(dst, h...)
	dst = append(dst, strings.Repeat(" ", pad)...)
	dst = append(dst, '\n')
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(t))
	}
	return dst
}

func writeTar(rng *rand.Rand, dir string, shards, per, lo, hi int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var toks []int64
	var body []byte
	for s := range shards {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("tok-%06d.tar", s)))
		if err != nil {
			return err
		}
		bw := bufio.NewWriterSize(f, 1<<20)
		tw := tar.NewWriter(bw)
		for i := range per {
			toks = doc(rng, toks, lo, hi)
			body = npy(body, toks)
			name := fmt.Sprintf("d%06d-%06d.tokens.npy", s, i)
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			if _, err := tw.Write(body); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Printf("%s/tok-{%06d..%06d}.tar\n", dir, 0, shards-1)
	return nil
}

func writeMegatron(rng *rand.Rand, prefix string, docs, lo, hi int) error {
	bin, err := os.Create(prefix + ".bin")
	if err != nil {
		return err
	}
	idx, err := os.Create(prefix + ".idx")
	if err != nil {
		return err
	}
	bb, ib := bufio.NewWriterSize(bin, 1<<20), bufio.NewWriterSize(idx, 1<<20)
	w, err := megatron.NewWriter(bb, ib, megatron.Uint16)
	if err != nil {
		return err
	}
	var toks []int64
	for range docs {
		toks = doc(rng, toks, lo, hi)
		if err := w.AddDocument(toks); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	for _, e := range []error{bb.Flush(), ib.Flush(), bin.Close(), idx.Close()} {
		if e != nil {
			return e
		}
	}
	fmt.Println(prefix + ".idx")
	return nil
}
