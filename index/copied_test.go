package index_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// copiedDataset returns the shards of a dataset under mem://a/ (written as an
// addressable index, whose path it returns too) and a registry whose mem:// objects
// are their copies under mem://b/: the same names, versions and sizes.
func copiedDataset(t *testing.T) (orig []shard.Info, copies []string, indexPath string, reg *source.Registry) {
	t.Helper()
	orig = synthShards("mem://a/", 6, 20) // shard 5 compressed, without offsets
	indexPath = filepath.Join(t.TempDir(), index.FileName)
	f, err := os.Create(indexPath)
	if err != nil {
		t.Fatal(err)
	}
	err = index.WriteAddressable(f, orig)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	byURL := map[string]shard.Info{}
	for _, in := range orig {
		u := strings.Replace(in.URL, "mem://a/", "mem://b/", 1)
		byURL[u] = in
		copies = append(copies, u)
	}
	reg = &source.Registry{}
	reg.Register("file", &rangeFile{})
	reg.Register("mem", memShards{byURL})
	return orig, copies, indexPath, reg
}

// A loader's lookup of a copied dataset whose entries it finds, under the
// originals' URLs, in an addressable index read lazily (the offsets left in the
// index's blocks) keeps none of them in the store without their offsets: a later
// lookup on the node (shardload index) takes the store's entries as they are, and
// would write an index of the copy without offsets.
func TestQuickOfCopyKeepsNoEntryWithoutOffsets(t *testing.T) {
	ctx := context.Background()
	orig, copies, indexPath, reg := copiedDataset(t)
	store, err := index.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutMany(orig); err != nil { // the node that indexed the originals
		t.Fatal(err)
	}
	lk := index.Lookup{Sources: reg, Index: indexPath, Store: store, LazyOffsets: true}
	infos, err := lk.Quick(ctx, copies, 4)
	if err != nil {
		t.Fatal(err)
	}
	if n := index.Deferred(infos); n != len(copies) {
		t.Errorf("the offsets of %d shards left in the index, want every shard's (%d)", n, len(copies))
	}
	for _, e := range store.GetMany(copies) {
		if e.Version != "" && len(e.Offsets) == 0 && !strings.HasSuffix(e.URL, ".gz") {
			t.Errorf("the store holds %s without its sample offsets", e.URL)
		}
	}
	// The next lookup of the copy on this node, from the store alone.
	got, err := index.Lookup{Sources: reg, Store: store, NoBeside: true}.Resolve(ctx, copies)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range got {
		if e.URL != copies[i] || e.Samples != orig[i].Samples || !slices.Equal(e.Offsets, orig[i].Offsets) {
			t.Errorf("shard %d: %s, %d samples, %d offsets; want %s, %d samples, %d offsets", i, e.URL, e.Samples, len(e.Offsets), copies[i], orig[i].Samples, len(orig[i].Offsets))
		}
	}
}

// Of the store's entries of one object counted under several URLs, the one with
// sample offsets is the one a copy takes, wherever the others lie.
func TestIdentitiesPreferOffsets(t *testing.T) {
	orig := synthShards("mem://a/", 1, 20)[0]
	for _, n := range []int{1, 4, 16} {
		store, err := index.OpenStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Put(orig); err != nil {
			t.Fatal(err)
		}
		for k := range n { // the same object elsewhere, kept without offsets
			e := orig
			e.URL, e.Offsets = fmt.Sprintf("mem://copy%d/%s", k, filepath.Base(orig.URL)), nil
			if err := store.Put(e); err != nil {
				t.Fatal(err)
			}
		}
		url := "mem://new/" + filepath.Base(orig.URL)
		e, ok := store.GetIdentity(url, orig.Version, orig.Size)
		if !ok || e.URL != url || e.Samples != orig.Samples || !slices.Equal(e.Offsets, orig.Offsets) {
			t.Errorf("%d copies without offsets: got %v %s, %d samples, %d offsets; want %d offsets", n, ok, e.URL, e.Samples, len(e.Offsets), len(orig.Offsets))
		}
	}
}
