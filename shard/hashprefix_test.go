package shard

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The naming rule is a format: datasets are written under it, by shardload gen and by
// users' own writers. These values were computed apart from this package (Python's
// hashlib, the formula in HashPrefix's doc); a change that alters any of them would
// strand every dataset written before it.
func TestHashPrefixPinned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefixes int
		want     string
	}{
		{"train-000000.tar", 16, "a"},
		{"train-000001.tar", 16, "9"},
		{"train-000123.tar", 16, "3"},
		{"train-000123.tar", 256, "93"},
		{"train-000123.tar", 100, "63"},
		{"train-000123.tar", 1, "0"},
		{"train-000123.tar", 65536, "eb93"},
		{"shard-42.tar.zst", 4096, "354"},
		{"", 16, "4"},
		{"ü.tar", 256, "fd"},
		{"train-000999.tar", 3, "1"},
	} {
		if got := HashPrefix(tc.name, tc.prefixes); got != tc.want {
			t.Errorf("HashPrefix(%q, %d) = %q, want %q", tc.name, tc.prefixes, got, tc.want)
		}
	}
}

// Every prefix has the width of the largest, and the names spread over all of them.
func TestHashPrefixSpread(t *testing.T) {
	for _, p := range []int{2, 3, 16, 17, 100, 256} {
		counts := map[string]int{}
		const n = 20000
		for i := range n {
			counts[HashPrefix(fmt.Sprintf("train-%06d.tar", i), p)]++
		}
		width := len(fmt.Sprintf("%x", p-1))
		if len(counts) != p {
			t.Errorf("%d prefixes: %d used", p, len(counts))
		}
		for k, c := range counts {
			if len(k) != width {
				t.Errorf("%d prefixes: prefix %q, want %d hex digits", p, k, width)
			}
			// Binomial: n/p expected, within 5 standard deviations (sqrt(n/p)).
			if exp := float64(n) / float64(p); math.Abs(float64(c)-exp) > 5*math.Sqrt(exp) {
				t.Errorf("%d prefixes: %q holds %d names, expected about %.0f", p, k, c, exp)
			}
		}
	}
	for _, p := range []int{0, -1, MaxHashPrefixes + 1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("HashPrefix over %d prefixes did not panic", p)
				}
			}()
			HashPrefix("x", p)
		}()
	}
}

func TestExpandHash(t *testing.T) {
	h := func(name string, p int) string { return HashPrefix(name, p) }
	tests := []struct {
		in   string
		want []string
	}{
		{"s3://b/{hash:16}/train-{000..002}.tar", []string{
			"s3://b/" + h("train-000.tar", 16) + "/train-000.tar",
			"s3://b/" + h("train-001.tar", 16) + "/train-001.tar",
			"s3://b/" + h("train-002.tar", 16) + "/train-002.tar"}},
		// The name is what follows the URL's last "/", subdirectories after the
		// prefix included in nothing but the path.
		{"d/{hash:256}/x/{a,b}.tar", []string{"d/" + h("a.tar", 256) + "/x/a.tar", "d/" + h("b.tar", 256) + "/x/b.tar"}},
		// Two placeholders take the same name; lists before them multiply as ever.
		{"{p,q}/{hash:4}/{hash:16}/n-{1..2}", []string{
			"p/" + h("n-1", 4) + "/" + h("n-1", 16) + "/n-1", "p/" + h("n-2", 4) + "/" + h("n-2", 16) + "/n-2",
			"q/" + h("n-1", 4) + "/" + h("n-1", 16) + "/n-1", "q/" + h("n-2", 4) + "/" + h("n-2", 16) + "/n-2"}},
		// Escaped braces and names that merely start with "hash:" are not placeholders.
		{`\{hash:4\}/a`, []string{"{hash:4}/a"}},
		{"{hash:4,b}/a", []string{"hash:4/a", "b/a"}},
		{"{hash:1}/a{1..2}", []string{"0/a1", "0/a2"}},
		// The name is unescaped before it is hashed.
		{`{hash:256}/a\,b`, []string{h("a,b", 256) + "/a,b"}},
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
		if n, err := Count(tc.in); err != nil || n != uint64(len(tc.want)) {
			t.Errorf("Count(%q) = %d, %v; want %d", tc.in, n, err, len(tc.want))
		}
	}
}

func TestExpandHashErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"s3://b/{hash:0}/a.tar", "{hash:0}: want {hash:P}"},
		{"s3://b/{hash:65537}/a.tar", "from 1 to 65536"},
		{"s3://b/{hash:x}/a.tar", "{hash:x}: want"},
		{"s3://b/{hash:}/a.tar", "{hash:}: want"},
		{"s3://b/{hash:016}/a.tar", "{hash:016}: want"},
		{"s3://b/{hash:-4}/a.tar", "{hash:-4}: want"},
		{"s3://b/{hash:1..4}/a.tar", "{hash:1..4}: want"},
		{"s3://b/train-{hash:16}.tar", `no "/" after it`},
		{"s3://b/{hash:16}", `no "/" after it`},
		{"s3://b/{hash:16}{/a,/b}", `no "/" after it`},
		{"s3://b/{x,{hash:16}}/a.tar", "inside another group"},
		{"s3://b/{{hash:16}}/a.tar", "inside another group"},
		{"s3://b/{x{hash:16}}/a.tar", "inside another group"},
	} {
		_, err := Expand(tc.in)
		_, cerr := Count(tc.in)
		if !errors.Is(err, ErrBadPattern) || !errors.Is(cerr, ErrBadPattern) {
			t.Errorf("Expand(%q): %v; Count: %v; want ErrBadPattern", tc.in, err, cerr)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.in) {
			t.Errorf("Expand(%q): %q lacks %q or the pattern", tc.in, err, tc.want)
		}
	}
}

var placeholderRE = regexp.MustCompile(`\{hash:([0-9]+)\}`)

// Expand agrees with a plain expansion of the pattern with each placeholder written
// as a marker, the marker then replaced by HashPrefix of the URL's name: the
// placeholders are found, and filled from the right name, whatever surrounds them.
func FuzzExpandHash(f *testing.F) {
	for _, s := range []string{"s3://b/{hash:16}/t-{0..9}.tar", "{a,b}/{hash:3}/{hash:256}/x{1..3}/{c,d}.tar",
		"{hash:4,b}/x", "{x}/{hash:2}/{y}", "{hash:7}/a/{b,c/d}", "{hash:0}/a", "a/{hash:3}", "{{hash:3}}/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if strings.ContainsAny(in, "\\\x00") {
			return
		}
		got, err := Expand(in)
		if err != nil {
			return
		}
		marked := placeholderRE.ReplaceAllString(in, "\x00$1\x00")
		plain, err := Expand(marked)
		if err != nil || len(plain) != len(got) {
			t.Fatalf("Expand(%q): %d URLs; with markers %q: %d URLs, %v", in, len(got), marked, len(plain), err)
		}
		for i, u := range plain {
			name := u[strings.LastIndexByte(u, '/')+1:]
			parts := strings.Split(u, "\x00")
			for j := 1; j < len(parts); j += 2 {
				p, _ := strconv.Atoi(parts[j])
				parts[j] = HashPrefix(name, p)
			}
			if want := strings.Join(parts, ""); got[i] != want {
				t.Fatalf("Expand(%q)[%d] = %q, want %q", in, i, got[i], want)
			}
		}
	})
}

// A million names, the most one pattern gives, expand with their prefixes and
// without.
func BenchmarkExpandHash(b *testing.B) {
	for _, tc := range []struct{ name, pattern string }{
		{"plain", "s3://bucket/train-{000000..999999}.tar"},
		{"hashed", "s3://bucket/{hash:256}/train-{000000..999999}.tar"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				urls, err := Expand(tc.pattern)
				if err != nil || len(urls) != 1000000 {
					b.Fatal(len(urls), err)
				}
			}
		})
	}
}
