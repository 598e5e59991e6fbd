package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

var genCommand = command{
	name:  "gen",
	short: "write a synthetic dataset for tests and demos",
	args:  "DIR",
	summary: `Write a synthetic WebDataset dataset into DIR for tests and demos: each sample a random
"jpg" payload, a "cls" label and a "txt" caption, or the fields of another --preset. The
same flags give the same bytes. Prints the brace pattern that names the shards.

--preset docs writes documents for a language model to train on packed rows: each
sample one "tokens.npy", a 1-D uint16 array of --min-tokens to --max-tokens token ids
(a length drawn uniformly per document) in 2..1023, 0 and 1 left for pad and eos.
Index the shards and pack them (uncompressed, the default) with
--pack tokens.npy:SEQ_LEN:eos=1:pad=0.

With --prefixes P (more than 1), each shard goes into a directory named by its hashed
key prefix, DIR/3f/train-000123.tar, so that the keys of the dataset, once copied to an
object store, spread over P prefixes that the store scales separately (S3 serves about
5,500 GET/s per prefix). The prefix is the shard package's HashPrefix of the file name
(SHA-256, the first 8 bytes as a big-endian number, modulo P, in zero-padded
hexadecimal), and the printed pattern reads the shards back with a {hash:P} directory:
DIR/{hash:16}/train-{000000..000099}.tar, expanded with no listing.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		shards := fs.Int("shards", 4, "number of shards")
		samples := fs.Int("samples", 256, "samples per shard")
		minSize := byteSize(16 << 10)
		maxSize := byteSize(48 << 10)
		fs.Var(&minSize, "min-size", "smallest jpg payload (default preset)")
		fs.Var(&maxSize, "max-size", "largest jpg payload (default preset)")
		preset := fs.String("preset", "default", "sample fields: default (16-48 KiB jpg, cls, txt), images (~110 KB jpg, cls), tokens (2048 int32 tokens as npy, cls) or docs (a tokens.npy document of uint16 token ids)")
		minTokens := fs.Int("min-tokens", 1, "shortest document (docs preset)")
		maxTokens := fs.Int("max-tokens", 1024, "longest document (docs preset)")
		comp := fs.String("compression", "none", "whole-shard compression: none, gzip or zstd")
		seed := fs.Uint64("seed", 1, "random seed")
		prefixes := fs.Int("prefixes", 1, fmt.Sprintf("hashed key prefixes the shards are spread over, one directory each (read back with a {hash:P} pattern; 1: all directly in DIR; at most %d)", shard.MaxHashPrefixes))
		return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
			if len(args) != 1 {
				return fmt.Errorf("%w: want one output directory", errUsage)
			}
			fields, ok := shardgen.Presets[*preset]
			if !ok {
				return fmt.Errorf("%w: --preset %q: want default, images, tokens or docs", errUsage, *preset)
			}
			if *minTokens < 1 || *minTokens > *maxTokens {
				return fmt.Errorf("%w: --min-tokens %d, --max-tokens %d: want 1 <= min <= max", errUsage, *minTokens, *maxTokens)
			}
			spec := shardgen.Spec{Shards: *shards, SamplesPerShard: *samples, Seed: *seed, Fields: fields}.Defaults()
			if *shards <= 0 || *samples <= 0 || minSize > maxSize {
				return fmt.Errorf("%w: need --shards > 0, --samples > 0 and --min-size <= --max-size", errUsage)
			}
			if *prefixes < 1 || *prefixes > shard.MaxHashPrefixes {
				return fmt.Errorf("%w: --prefixes %d: want 1 to %d", errUsage, *prefixes, shard.MaxHashPrefixes)
			}
			spec.KeyPrefixes = *prefixes
			switch *preset {
			case "default":
				spec.Fields[0].MinBytes, spec.Fields[0].MaxBytes = int(minSize), int(maxSize)
			case "docs":
				spec.Fields = slices.Clone(spec.Fields) // the preset itself stays as it is
				spec.Fields[0].MinTokens, spec.Fields[0].MaxTokens = *minTokens, *maxTokens
			}
			switch *comp {
			case "none":
			case "gzip":
				spec.Compression = shard.Gzip
			case "zstd":
				spec.Compression = shard.Zstd
			default:
				return fmt.Errorf("%w: --compression %q: want none, gzip or zstd", errUsage, *comp)
			}
			if _, err := shardgen.Generate(args[0], spec); err != nil {
				return err
			}
			_, err := fmt.Fprintln(stdout, filepath.Join(args[0], spec.Pattern()))
			return err
		}
	},
}
