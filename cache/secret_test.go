package cache

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardload/shardload/source"
)

// presigned serves the objects of a fakeSource under presigned URLs: any query
// string and user information are accepted, and the URLs it was asked for are
// recorded.
type presigned struct {
	*fakeSource
	mu   sync.Mutex
	seen []string
}

func (p *presigned) base(url string) string {
	p.mu.Lock()
	p.seen = append(p.seen, url)
	p.mu.Unlock()
	base, _, _ := strings.Cut(url, "?")
	if at := strings.Index(base, "@"); at >= 0 {
		base = "https://" + base[at+1:]
	}
	return base
}

func (p *presigned) Stat(ctx context.Context, url string) (source.Info, error) {
	info, err := p.fakeSource.Stat(ctx, p.base(url))
	info.URL = url
	return info, err
}

func (p *presigned) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return p.fakeSource.Open(ctx, p.base(url))
}

// The cache writes no secret of a URL to its files (the meta files held presigned
// URLs whole), files an object under its URL without them, and asks the source with
// the URL as given: a presigned URL with a new signature finds the entry, after a
// restart too.
func TestCacheStoresNoSecrets(t *testing.T) {
	dir := t.TempDir()
	up := &presigned{fakeSource: newFake()}
	data := randBytes(7, 300<<10)
	up.put("https://h.example/b/k.tar", data, "v1")
	first := "https://user:PASSWORD1@h.example/b/k.tar?X-Amz-Credential=CRED1&X-Amz-Signature=SIG1"
	c := newCache(t, Options{Dir: dir}, up)
	if got := readAll(t, c, first); !bytes.Equal(got, data) {
		t.Fatal("first read differs")
	}
	c.Close()
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		for _, secret := range []string{"PASSWORD1", "CRED1", "SIG1"} {
			if bytes.Contains(b, []byte(secret)) || strings.Contains(path, secret) {
				t.Errorf("%s holds %s", path, secret)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	second := "https://user:PASSWORD2@h.example/b/k.tar?X-Amz-Credential=CRED2&X-Amz-Signature=SIG2"
	// The open asks the source (not served by the first process's recent check).
	c = newCache(t, Options{Dir: dir, ValidateWithin: -1}, up)
	if got := readAll(t, c, second); !bytes.Equal(got, data) {
		t.Fatal("second read differs")
	}
	if st := c.Stats(); st.DiskHits != 1 || st.Fetches != 0 || up.openCount("https://h.example/b/k.tar") != 1 {
		t.Errorf("new signature after a restart: %+v, %d opens; want a disk hit", st, up.openCount("https://h.example/b/k.tar"))
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if last := up.seen[len(up.seen)-1]; last != second {
		t.Errorf("the source was asked for %q, want the URL as given", last)
	}
}
