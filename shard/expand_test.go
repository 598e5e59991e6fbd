package shard

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"s3://b/train.tar", []string{"s3://b/train.tar"}},
		{"t-{000000..000002}.tar", []string{"t-000000.tar", "t-000001.tar", "t-000002.tar"}},
		{"t-{8..11}", []string{"t-8", "t-9", "t-10", "t-11"}},
		{"t-{08..11}", []string{"t-08", "t-09", "t-10", "t-11"}},
		{"t-{3..1}", []string{"t-3", "t-2", "t-1"}},
		{"t-{0..10..5}", []string{"t-0", "t-5", "t-10"}},
		{"t-{10..0..5}", []string{"t-10", "t-5", "t-0"}},
		{"{-1..1}", []string{"-1", "0", "1"}},
		{"{a..c}", []string{"a", "b", "c"}},
		{"{train,val}-{0..1}.tar", []string{"train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"}},
		{"{a,{b,c}d}", []string{"a", "bd", "cd"}},
		{"{a,b{0..1}}", []string{"a", "b0", "b1"}},
		{"{,x}y", []string{"y", "xy"}},
		{"{x}", []string{"{x}"}},
		{"{x}{1,2}", []string{"{x}1", "{x}2"}},
		{"{x{1,2}}", []string{"{x1}", "{x2}"}},
		{`a\{1,2\}`, []string{"a{1,2}"}},
		{`{a\,b,c}`, []string{"a,b", "c"}},
		{"{1..2}{a,b}", []string{"1a", "1b", "2a", "2b"}},
	}
	for _, tc := range tests {
		got, err := Expand(tc.in)
		if err != nil {
			t.Errorf("Expand(%q): %v", tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestExpandErrors(t *testing.T) {
	for _, in := range []string{"a{", "a}", "{a,b", "}{", "{0..99999999}", "{0..1..0}", "{0..999}{0..999}{0..9}"} {
		if _, err := Expand(in); !errors.Is(err, ErrBadPattern) {
			t.Errorf("Expand(%q): err %v, want ErrBadPattern", in, err)
		}
	}
}

func TestExpandAll(t *testing.T) {
	got, err := ExpandAll([]string{"a{1..2}", "b"})
	if err != nil || strings.Join(got, " ") != "a1 a2 b" {
		t.Errorf("got %q, %v", got, err)
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"t-{000..010}.tar", "{a,{b,c}d}", `a\{x`, "{1..5..2}{a..c}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := Expand(in)
		if err != nil {
			return
		}
		if len(out) == 0 || len(out) > MaxExpansion {
			t.Fatalf("Expand(%q) gave %d URLs", in, len(out))
		}
	})
}
