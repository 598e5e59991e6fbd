package source_test

import (
	"context"
	"io"
	"testing"

	"github.com/shardload/shardload/source"
)

type costly struct{ source.Source }

func (costly) RequestCost() int64 { return 12345 }

type remote struct{}

func (remote) Stat(context.Context, string) (source.Info, error)   { return source.Info{}, nil }
func (remote) Open(context.Context, string) (io.ReadCloser, error) { return nil, nil }

func TestRequestCostOf(t *testing.T) {
	var reg source.Registry
	reg.Register("file", &source.File{})
	reg.Register("s3", remote{})
	reg.Register("mine", costly{remote{}})
	reg.Register("wrapped", source.NewFetcher(costly{remote{}}, source.FetchOptions{}))
	for url, want := range map[string]int64{
		"train.tar":               source.FileRequestCost,
		"file:///d/train.tar":     source.FileRequestCost,
		"s3://b/train-{0..3}.tar": source.RemoteRequestCost,
		"mine://x":                12345,
		"wrapped://x":             12345,
		"nope://x":                source.RemoteRequestCost,
	} {
		if got := source.RequestCostOf(&reg, url); got != want {
			t.Errorf("RequestCostOf(%q) = %d, want %d", url, got, want)
		}
	}
	if got := source.RequestCostOf(&source.File{}, "x"); got != source.FileRequestCost {
		t.Errorf("RequestCostOf(File) = %d", got)
	}
}
