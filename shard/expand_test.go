package shard

import (
	"errors"
	"runtime"
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

// Ranges whose count overflows used to panic in make; counts beyond the limit used to
// be found only after building up to a million URLs. Every over-limit pattern now
// fails before expanding anything, naming itself and the count it would give.
func TestExpandOverflowAndLimit(t *testing.T) {
	for _, tc := range []struct{ in, count string }{
		{"{0..9223372036854775807}", "9223372036854775808"},
		{"s3://b/{-9223372036854775808..9223372036854775807}.tar", "at least 18446744073709551615"},
		{"{9223372036854775807..-9223372036854775808}", "at least 18446744073709551615"},
		{"{-9223372036854775808..9223372036854775807..2}", "9223372036854775808"},
		{"{0..9223372036854775807}{0..9223372036854775807}", "at least 18446744073709551615"},
		{"t-{0..1048576}.tar", "1048577"},
		{"{0..1024}{0..1023}", "1049600"},
		{"{a,b}{0..1048575}", "2097152"},
		{"{{0..1048575},x}", "1048577"},
		{"{x{0..2000}}{0..999}", "2001000"},
		{"{a..z}{a..z}{a..z}{a..z}{a..z}", "11881376"},
	} {
		var got []string
		var err error
		alloc := allocated(func() { got, err = Expand(tc.in) })
		if !errors.Is(err, ErrBadPattern) || got != nil {
			t.Errorf("Expand(%q): %d URLs, %v; want ErrBadPattern", tc.in, len(got), err)
			continue
		}
		for _, want := range []string{tc.in, "expands to " + tc.count + " URLs", "MaxExpansion (1048576)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Expand(%q): %q lacks %q", tc.in, err, want)
			}
		}
		if alloc > 64<<10 {
			t.Errorf("Expand(%q) allocated %d bytes before failing", tc.in, alloc)
		}
	}
	// All patterns of ExpandAll together, counted before any is expanded.
	var err error
	alloc := allocated(func() { _, err = ExpandAll([]string{"a-{0..599999}", "b-{0..599999}"}) })
	if !errors.Is(err, ErrBadPattern) || !strings.Contains(err.Error(), `"b-{0..599999}"`) || !strings.Contains(err.Error(), "1200000 in all") {
		t.Errorf("ExpandAll over the limit: %v", err)
	}
	if alloc > 64<<10 {
		t.Errorf("ExpandAll allocated %d bytes before failing", alloc)
	}
	// At the limit, and endpoints at the ends of int64, are fine.
	if n, err := Count("{1..1024}{0..1023}"); n != MaxExpansion || err != nil {
		t.Errorf("Count at the limit: %d, %v", n, err)
	}
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"{9223372036854775806..9223372036854775807}", []string{"9223372036854775806", "9223372036854775807"}},
		{"{-9223372036854775807..-9223372036854775808}", []string{"-9223372036854775807", "-9223372036854775808"}},
		{"{-9223372036854775808..9223372036854775807..9223372036854775807}", []string{"-9223372036854775808", "-1", "9223372036854775806"}},
		{"{0..5..-9223372036854775808}", []string{"0"}},
		{"{a..z..9223372036854775807}", []string{"a"}},
		{"{z..a..-9223372036854775808}", []string{"z"}},
		{"{-01..1}", []string{"-01", "000", "001"}}, // as bash pads
	} {
		got, err := Expand(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// allocated returns the bytes fn allocates.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Count agrees with Expand.
func TestCount(t *testing.T) {
	for _, in := range []string{"s3://b/train.tar", "t-{000000..000002}.tar", "{10..1..3}", "{a..e}", "{train,val}-{0..1}.tar",
		"{a,{b,c}d}", "{x}", "{x}{1,2}", "{x{1,2}}", `a\{1,2\}`, "{,x}y", "{1..2}{a,b}{c,d,e}", "{{1..3}..5}", "{1..{3,4}}"} {
		out, err := Expand(in)
		n, cerr := Count(in)
		if err != nil || cerr != nil || n != uint64(len(out)) {
			t.Errorf("%q: Count %d, %v; Expand %d URLs, %v", in, n, cerr, len(out), err)
		}
	}
	if _, err := Count("{0..1..0}"); !errors.Is(err, ErrBadPattern) {
		t.Errorf("step 0: %v", err)
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"t-{000..010}.tar", "{a,{b,c}d}", `a\{x`, "{1..5..2}{a..c}",
		"{0..9223372036854775807}", "{-9223372036854775808..9223372036854775807..3}", "{a..z..9223372036854775807}",
		"{x{0..2000}}{0..999}", "{{1..3}..5}",
		"s3://b/{hash:16}/t-{0..9}.tar", "{hash:4,b}/x", `\{hash:4\}/a`, "{x,{hash:2}}/a", "{hash:0}/a", "a/{hash:3}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		n, cerr := Count(in)
		out, err := Expand(in)
		if (cerr != nil) != (err != nil) && n <= MaxExpansion {
			t.Fatalf("Count(%q): %d, %v; Expand: %v", in, n, cerr, err)
		}
		if err != nil {
			if !errors.Is(err, ErrBadPattern) {
				t.Fatalf("Expand(%q): %v", in, err)
			}
			return
		}
		if len(out) == 0 || len(out) > MaxExpansion || uint64(len(out)) != n {
			t.Fatalf("Expand(%q) gave %d URLs, Count %d", in, len(out), n)
		}
	})
}
