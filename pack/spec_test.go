package pack

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
		str  string // canonical form; in when empty
	}{
		{in: "tokens:2048", want: Spec{Field: "tokens", SeqLen: 2048}},
		{in: "tokens.npy:8:eos=0", want: Spec{Field: "tokens.npy", SeqLen: 8, HasEOS: true}},
		{in: "tokens.npy:8:eos=50256", want: Spec{Field: "tokens.npy", SeqLen: 8, HasEOS: true, EOS: 50256, Pad: 50256}},
		{in: "t:8:eos=2:pad=0", want: Spec{Field: "t", SeqLen: 8, HasEOS: true, EOS: 2, Pad: 0}},
		{in: "t:8:pad=0:eos=2", want: Spec{Field: "t", SeqLen: 8, HasEOS: true, EOS: 2, Pad: 0}, str: "t:8:eos=2:pad=0"},
		{in: "t:8:pad=7", want: Spec{Field: "t", SeqLen: 8, Pad: 7}},
		{in: "t:8:pad=0", want: Spec{Field: "t", SeqLen: 8}, str: "t:8"},
		{in: "t:8:eos=3:pad=3", want: Spec{Field: "t", SeqLen: 8, HasEOS: true, EOS: 3, Pad: 3}, str: "t:8:eos=3"},
		{in: "a.b.c:1", want: Spec{Field: "a.b.c", SeqLen: 1}},
		{in: "t:0008", want: Spec{Field: "t", SeqLen: 8}, str: "t:8"},
		{in: "t:1073741824", want: Spec{Field: "t", SeqLen: MaxSeqLen}},
		{in: "t:4:eos=9223372036854775807", want: Spec{Field: "t", SeqLen: 4, HasEOS: true, EOS: math.MaxInt64, Pad: math.MaxInt64}},
		{in: "t:8:eos=2:ids=int32", want: Spec{Field: "t", SeqLen: 8, HasEOS: true, EOS: 2, Pad: 2, Int32: true}},
		{in: "t:8:ids=int32:pad=5", want: Spec{Field: "t", SeqLen: 8, Pad: 5, Int32: true}, str: "t:8:pad=5:ids=int32"},
		{in: "t:8:ids=int64", want: Spec{Field: "t", SeqLen: 8}, str: "t:8"},
	} {
		got, err := ParseSpec(tc.in)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		str := tc.str
		if str == "" {
			str = tc.in
		}
		if got.String() != str {
			t.Errorf("ParseSpec(%q).String() = %q, want %q", tc.in, got.String(), str)
		}
	}
}

func TestParseSpecErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"", ErrField},
		{":8", ErrField},
		{"tokens", ErrSeqLen},
		{"tokens:", ErrSeqLen},
		{"tokens:0", ErrSeqLen},
		{"tokens:-1", ErrSeqLen},
		{"tokens:+8", ErrSeqLen},
		{"tokens:8k", ErrSeqLen},
		{"tokens: 8", ErrSeqLen},
		{"tokens:1073741825", ErrSeqLen},
		{"tokens:99999999999999999999", ErrSeqLen},
		{"tokens:8:", ErrUnknownOption},
		{"tokens:8:eos", ErrUnknownOption},
		{"tokens:8:bos=1", ErrUnknownOption},
		{"tokens:8:EOS=1", ErrUnknownOption},
		{"tokens:8:eos=1:", ErrUnknownOption},
		{"tokens:8:eos=1:eos=2", ErrDuplicateOption},
		{"tokens:8:pad=1:eos=2:pad=1", ErrDuplicateOption},
		{"tokens:8:ids=int32:ids=int64", ErrDuplicateOption},
		{"tokens:8:ids=int16", ErrUnknownOption},
		{"tokens:8:ids", ErrUnknownOption},
		{"tokens:8:eos=-1", ErrBadID},
		{"tokens:8:pad=-5", ErrBadID},
		{"tokens:8:eos=", ErrBadID},
		{"tokens:8:eos=x", ErrBadID},
		{"tokens:8:eos=+1", ErrBadID},
		{"tokens:8:eos=9223372036854775808", ErrBadID},
	} {
		_, err := ParseSpec(tc.in)
		if !errors.Is(err, tc.want) {
			t.Errorf("ParseSpec(%q) = %v, want %v", tc.in, err, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), "pack: ") || !strings.Contains(err.Error(), tc.in) {
			t.Errorf("ParseSpec(%q): %q does not name the spec", tc.in, err)
		}
	}
	_, err := ParseSpec("tokens:8:eos=-1")
	if !strings.Contains(err.Error(), "negative") {
		t.Errorf("a negative id: %v", err)
	}
}

func TestSpecCheck(t *testing.T) {
	must := func(s string) Spec {
		sp, err := ParseSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	for _, tc := range []struct {
		spec  Spec
		maxID int64
		want  error
	}{
		{must("t:8:eos=2147483647"), math.MaxInt32, nil},
		{must("t:8:eos=2147483648"), math.MaxInt32, ErrIDRange},
		{must("t:8:eos=1:pad=2147483648"), math.MaxInt32, ErrIDRange},
		{must("t:8:pad=70000"), math.MaxUint16, ErrIDRange},
		{must("t:8"), 0, nil},
		{Spec{Field: "t", SeqLen: 0}, math.MaxInt32, ErrSeqLen},
		{Spec{SeqLen: 8}, math.MaxInt32, ErrField},
		{Spec{Field: "a:b", SeqLen: 8}, math.MaxInt32, ErrField},
		{Spec{Field: "t", SeqLen: 8, HasEOS: true, EOS: -1}, math.MaxInt32, ErrBadID},
		{Spec{Field: "t", SeqLen: 8, Pad: -1}, math.MaxInt32, ErrBadID},
	} {
		err := tc.spec.Check(tc.maxID)
		if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("%+v.Check(%d) = %v, want %v", tc.spec, tc.maxID, err, tc.want)
		}
		if errors.Is(err, ErrIDRange) && !strings.Contains(err.Error(), tc.spec.String()) {
			t.Errorf("%v does not name the spec %s", err, tc.spec)
		}
	}
}
