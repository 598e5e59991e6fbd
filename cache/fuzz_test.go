package cache

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// FuzzParseMeta feeds the meta parser arbitrary files: it must not panic, and what it
// accepts must name an object that hashes to the file's name and have a sane size and
// checksum for each of its blocks.
func FuzzParseMeta(f *testing.F) {
	url := "s3://bucket/train-000000.tar"
	good, _ := json.Marshal(meta{Format: metaFormat, URL: url, Version: `"abc"`, Size: 1234, Block: blockSize(1234), XXH3: "0123456789abcdef", Fetched: time.Unix(1, 0).UTC()})
	f.Add(good)
	f.Add([]byte(`{"format":3,"url":"s3://bucket/train-000000.tar","size":-1,"block":262144,"xxh3":"0123456789abcdef"}`))
	f.Add([]byte(`{"format":3,"url":"s3://bucket/train-000000.tar","size":300000,"block":262144,"xxh3":"0123456789abcdef0123456789ABCDEF"}`))
	f.Add([]byte(`{"format":1}{}`))
	f.Add([]byte(""))
	hash := hashURL(url)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMeta(b, hash)
		if err != nil {
			return
		}
		if hashURL(m.URL) != hash || m.Size < 0 || m.Format != metaFormat || m.Block != blockSize(m.Size) || int64(len(m.sums)) != m.blocks() {
			t.Fatalf("accepted %q as %+v", b, m)
		}
	})
}

// FuzzMatchFile checks matchFile, which opening a directory runs on every file name,
// against the regular expression that defines the names the disk tier creates.
func FuzzMatchFile(f *testing.F) {
	h, g := hashURL("s3://b/a.tar"), "0123456789abcdef"
	for _, name := range []string{h + "-" + g + ".data", h + "-" + g + ".meta", "tmp-" + h + "-" + g + "-4096.data",
		"tmp-" + h + "-" + g + ".meta", h + "-" + g + "-.data", h + "-" + g + "-12345678901234567890.data", h + ".lock",
		"tmp-tmp-" + h + "-" + g + ".data", h[:63] + "A-" + g + ".data", "budget", "lock", ""} {
		f.Add(name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := matchFile(name), fileRE.FindStringSubmatch(name); !slices.Equal(got, want) {
			t.Fatalf("matchFile(%q) = %q, the expression gives %q", name, got, want)
		}
		if got, want := lockName(name), lockRE.FindStringSubmatch(name); !slices.Equal(got, want) {
			t.Fatalf("lockName(%q) = %q, the expression gives %q", name, got, want)
		}
	})
}
