package shard

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxExpansion is the most URLs one pattern may expand to. A typo such as
// {0..99999999} fails fast instead of filling memory.
const MaxExpansion = 1 << 20

// ErrBadPattern is wrapped by Expand's errors.
var ErrBadPattern = errors.New("shard: bad URL pattern")

// Expand expands brace patterns in a shard URL the way WebDataset (Python's
// braceexpand) does:
//
//	train-{000000..000003}.tar   numeric range; zero padding is kept (width of the
//	                             widest endpoint when either is zero-padded)
//	{10..1..3}                   ranges may count down and take a step
//	{a..e}                       letter ranges
//	{train,val}-{0..1}.tar       lists, several groups multiply, groups nest
//	\{ and \}                    literal braces
//
// A brace group holding neither a comma nor a range is kept literally ("{x}").
// Unbalanced braces and expansions beyond MaxExpansion are errors.
func Expand(pattern string) ([]string, error) {
	if err := checkBalanced(pattern); err != nil {
		return nil, err
	}
	out, err := expand(pattern)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadPattern, pattern, err)
	}
	for i, s := range out {
		out[i] = unescape(s)
	}
	return out, nil
}

// ExpandAll expands each pattern and concatenates the results in order.
func ExpandAll(patterns []string) ([]string, error) {
	var out []string
	for _, p := range patterns {
		urls, err := Expand(p)
		if err != nil {
			return nil, err
		}
		if len(out)+len(urls) > MaxExpansion {
			return nil, fmt.Errorf("%w: more than %d URLs", ErrBadPattern, MaxExpansion)
		}
		out = append(out, urls...)
	}
	return out, nil
}

func checkBalanced(p string) error {
	depth := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
			if depth < 0 {
				return fmt.Errorf("%w %q: unmatched '}' at byte %d", ErrBadPattern, p, i)
			}
		}
	}
	if depth != 0 {
		return fmt.Errorf("%w %q: unclosed '{'", ErrBadPattern, p)
	}
	return nil
}

// expand returns the expansions of p, still escaped.
func expand(p string) ([]string, error) {
	open, close := findGroup(p, 0)
	for open >= 0 {
		body := p[open+1 : close]
		if alts := splitTop(body); len(alts) > 1 {
			return combine(p[:open], alts, p[close+1:], true)
		}
		if items, ok, err := expandRange(body); err != nil {
			return nil, err
		} else if ok {
			return combine(p[:open], items, p[close+1:], false)
		}
		// A literal group such as {x}: its inside may still hold groups, so expand it
		// and keep the braces.
		inner, err := expand(body)
		if err != nil {
			return nil, err
		}
		if len(inner) != 1 || inner[0] != body {
			for i := range inner {
				inner[i] = "\\{" + inner[i] + "\\}"
			}
			return combine(p[:open], inner, p[close+1:], false)
		}
		open, close = findGroup(p, close+1)
	}
	return []string{p}, nil
}

// combine returns prefix x mids x expand(rest), expanding each mid first when
// recurse is set.
func combine(prefix string, mids []string, rest string, recurse bool) ([]string, error) {
	tails, err := expand(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mids {
		ms := []string{m}
		if recurse {
			if ms, err = expand(m); err != nil {
				return nil, err
			}
		}
		if len(out)+len(ms)*len(tails) > MaxExpansion {
			return nil, fmt.Errorf("more than %d URLs", MaxExpansion)
		}
		for _, x := range ms {
			for _, t := range tails {
				out = append(out, prefix+x+t)
			}
		}
	}
	return out, nil
}

// findGroup returns the byte indexes of the first unescaped top-level '{' at or after
// from and its matching '}', or -1, -1.
func findGroup(p string, from int) (int, int) {
	depth, open := 0, -1
	for i := from; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				open = i
			}
			depth++
		case '}':
			depth--
			if depth == 0 {
				return open, i
			}
		}
	}
	return -1, -1
}

// splitTop splits s at commas outside nested braces.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandRange expands "a..b" or "a..b..step" (numbers or single letters).
func expandRange(body string) ([]string, bool, error) {
	f := strings.Split(body, "..")
	if len(f) != 2 && len(f) != 3 {
		return nil, false, nil
	}
	step := int64(1)
	if len(f) == 3 {
		s, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, false, nil
		}
		if s == 0 {
			return nil, false, fmt.Errorf("range {%s} has step 0", body)
		}
		step = max(s, -s)
	}
	lo, errLo := strconv.ParseInt(f[0], 10, 64)
	hi, errHi := strconv.ParseInt(f[1], 10, 64)
	if errLo == nil && errHi == nil {
		width := 0
		if padded(f[0]) || padded(f[1]) {
			width = max(len(f[0]), len(f[1]))
		}
		n := (max(lo, hi)-min(lo, hi))/step + 1
		if n > MaxExpansion {
			return nil, false, fmt.Errorf("range {%s} has more than %d values", body, MaxExpansion)
		}
		out := make([]string, 0, n)
		for i := int64(0); i < n; i++ {
			v := lo + i*step
			if hi < lo {
				v = lo - i*step
			}
			out = append(out, pad(v, width))
		}
		return out, true, nil
	}
	if len(f[0]) == 1 && len(f[1]) == 1 && isLetter(f[0][0]) && isLetter(f[1][0]) {
		a, b := int64(f[0][0]), int64(f[1][0])
		var out []string
		if a <= b {
			for c := a; c <= b; c += step {
				out = append(out, string(rune(c)))
			}
		} else {
			for c := a; c >= b; c -= step {
				out = append(out, string(rune(c)))
			}
		}
		return out, true, nil
	}
	return nil, false, nil
}

func padded(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return len(s) > 1 && s[0] == '0'
}

func pad(v int64, width int) string {
	s := strconv.FormatInt(max(v, -v), 10)
	neg := v < 0
	w := width
	if neg {
		w--
	}
	if len(s) < w {
		s = strings.Repeat("0", w-len(s)) + s
	}
	if neg {
		s = "-" + s
	}
	return s
}

func isLetter(c byte) bool { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }

func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}' || s[i+1] == ',' || s[i+1] == '\\') {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
