package shardgen

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
)

// IndexURL is shard i's URL in a synthetic index (Index): an object in a bucket of
// an object store, so that a lookup checks none of them against its entry beyond
// index.Lookup.CheckUpTo.
func IndexURL(i int) string { return fmt.Sprintf("s3://bucket/train/shard-%07d.tar", i) }

// IndexPattern is the brace pattern of the URLs of a synthetic index of n shards
// (IndexURL 0 to n-1).
func IndexPattern(n int) string {
	return fmt.Sprintf("s3://bucket/train/shard-{%07d..%07d}.tar", 0, n-1)
}

// Index returns the path of the index of n synthetic shards of samples samples each
// in dir (addressable: written by index.WriteAddressable, else index.Write), writing
// it there first unless it is there already (from an earlier run: at 10^6 shards it
// takes minutes to write). The shards are those of IndexURL, none of them written:
// their samples are 100-120 KB (a tar header and the data in 512-byte blocks) from a
// generator seeded by the shard's number, each with its offset; with members, the
// index holds them too (format version 2): a jpg and a cls of one byte, in the same
// bytes of tar (the same counts).
func Index(dir string, n, samples int, addressable, members bool) (string, error) {
	name := "whole.idx"
	if addressable {
		name = "addressable-2.idx" // its counts in a 1 MiB window (addressable.idx: 8 MiB)
	}
	if members {
		name = strings.TrimSuffix(name, ".idx") + "-members.idx"
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	infos := make([]shard.Info, n)
	for i := range infos {
		r := rand.New(rand.NewPCG(uint64(i), 7))
		offs := make([]int64, samples)
		off := int64(0)
		var mb shard.MembersBuilder
		for j := range offs {
			offs[j] = off
			size := 100_000 + r.Int64N(20_000)
			off += 512 + (size+511)/512*512
			if members { // the same tar bytes: the jpg 1024 bytes less, and the cls
				mb.Sample()
				mb.Member("jpg", size-1024)
				mb.Member("cls", 1)
			}
		}
		infos[i] = shard.Info{URL: IndexURL(i), Samples: samples, Version: fmt.Sprintf("%d-%x", off+1024, i), Size: off + 1024, Offsets: offs}
		if members {
			infos[i].Members = mb.Members()
		}
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	if addressable {
		err = index.WriteAddressable(f, infos)
	} else {
		err = index.Write(f, infos, true)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, nil
}
