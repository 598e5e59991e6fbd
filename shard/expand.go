package shard

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// MaxExpansion is the most URLs that Expand gives for one pattern and ExpandAll for
// all its patterns together: 1,048,576. The count is worked out before anything is
// expanded, so a typo such as {0..99999999} fails at once, naming the pattern and the
// count, instead of filling memory. The command line, the library (Config.URLs) and
// the loader process all expand through ExpandAll.
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
//	s3://b/{hash:16}/train-{0..9}.tar
//	                             a hashed key prefix: HashPrefix of each URL's
//	                             name (what follows its last "/") over 16 prefixes
//
// A brace group holding neither a comma nor a range is kept literally ("{x}"), except
// {hash:P}, which is filled once the rest of the URL is expanded. It must stand in a
// directory of the pattern: in no other group, with a "/" after it outside any group
// (the name it is derived from cannot hold it); P is a decimal integer from 1 to
// MaxHashPrefixes.
// Unbalanced braces and patterns that would give more than MaxExpansion URLs are
// errors; the count is checked, with no arithmetic overflow, before anything is
// allocated.
func Expand(pattern string) ([]string, error) {
	n, err := Count(pattern)
	if err != nil {
		return nil, err
	}
	if n > MaxExpansion {
		return nil, fmt.Errorf("%w %q: it expands to %s URLs, more than MaxExpansion (%d)", ErrBadPattern, pattern, formatCount(n), MaxExpansion)
	}
	out, err := expand(pattern)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadPattern, pattern, err)
	}
	hashed := strings.Contains(pattern, "{hash:")
	for i, s := range out {
		if hashed {
			s = fillHash(s)
		}
		out[i] = unescape(s)
	}
	return out, nil
}

// ExpandAll expands each pattern and concatenates the results in order. All patterns
// together may give at most MaxExpansion URLs; the counts are checked before any
// pattern is expanded.
func ExpandAll(patterns []string) ([]string, error) {
	var total uint64
	for _, p := range patterns {
		n, err := Count(p)
		if err != nil {
			return nil, err
		}
		total = addSat(total, n)
		if total > MaxExpansion {
			if n == total {
				return nil, fmt.Errorf("%w %q: it expands to %s URLs, more than MaxExpansion (%d)", ErrBadPattern, p, formatCount(n), MaxExpansion)
			}
			return nil, fmt.Errorf("%w %q: it expands to %s URLs, which take the patterns to %s in all, more than MaxExpansion (%d)", ErrBadPattern, p, formatCount(n), formatCount(total), MaxExpansion)
		}
	}
	out := make([]string, 0, total)
	for _, p := range patterns {
		urls, err := Expand(p)
		if err != nil {
			return nil, err
		}
		out = append(out, urls...)
	}
	return out, nil
}

// Count returns how many URLs Expand would give for pattern, without expanding it:
// math.MaxUint64 stands for that many or more. It fails as Expand does on a pattern
// that is not well formed (unbalanced braces, a range with step 0).
func Count(pattern string) (uint64, error) {
	if err := checkBalanced(pattern); err != nil {
		return 0, err
	}
	n, err := count(pattern)
	if err == nil {
		err = checkHash(pattern)
	}
	if err != nil {
		return 0, fmt.Errorf("%w %q: %v", ErrBadPattern, pattern, err)
	}
	return n, nil
}

// formatCount writes a count from Count, saying "at least" for a saturated one.
func formatCount(n uint64) string {
	if n == math.MaxUint64 {
		return "at least " + strconv.FormatUint(n, 10)
	}
	return strconv.FormatUint(n, 10)
}

// count returns how many expansions expand(p) gives, saturating at MaxUint64. It
// follows expand step by step.
func count(p string) (uint64, error) {
	open, close := findGroup(p, 0)
	if open < 0 {
		return 1, nil
	}
	body, rest := p[open+1:close], p[close+1:]
	tails, err := count(rest)
	if err != nil {
		return 0, err
	}
	if alts := splitTop(body); len(alts) > 1 {
		var sum uint64
		for _, a := range alts {
			n, err := count(a)
			if err != nil {
				return 0, err
			}
			sum = addSat(sum, n)
		}
		return mulSat(sum, tails), nil
	}
	if rg, ok, err := parseRange(body); err != nil {
		return 0, err
	} else if ok {
		return mulSat(rg.n, tails), nil
	}
	// A literal group: expand keeps it as it is (one expansion of its inside) or
	// combines each expansion of its inside with the rest; either way the product.
	inner, err := count(body)
	if err != nil {
		return 0, err
	}
	return mulSat(inner, tails), nil
}

func addSat(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func mulSat(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
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
		if uint64(len(ms))*uint64(len(tails)) > uint64(MaxExpansion-len(out)) {
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

// rangeSpec is a parsed range "a..b" or "a..b..step": from lo, n values step apart,
// counting down when down is set; letters when letters is set.
type rangeSpec struct {
	lo      int64
	step    uint64 // magnitude, at least 1
	n       uint64 // number of values, MaxUint64 when that many or more
	down    bool
	letters bool
	width   int // zero padding of numbers: 0 for none
}

// parseRange parses a range group's inside. It reports false for a body that is no
// range (expand then keeps the group literally). All its arithmetic is on unsigned
// magnitudes: no endpoints or step overflow it.
func parseRange(body string) (rangeSpec, bool, error) {
	f := strings.Split(body, "..")
	if len(f) != 2 && len(f) != 3 {
		return rangeSpec{}, false, nil
	}
	rg := rangeSpec{step: 1}
	if len(f) == 3 {
		s, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return rangeSpec{}, false, nil
		}
		if s == 0 {
			return rangeSpec{}, false, fmt.Errorf("range {%s} has step 0", body)
		}
		rg.step = absU(s)
	}
	lo, errLo := strconv.ParseInt(f[0], 10, 64)
	hi, errHi := strconv.ParseInt(f[1], 10, 64)
	switch {
	case errLo == nil && errHi == nil:
		if padded(f[0]) || padded(f[1]) {
			rg.width = max(len(f[0]), len(f[1]))
		}
	case len(f[0]) == 1 && len(f[1]) == 1 && isLetter(f[0][0]) && isLetter(f[1][0]):
		lo, hi, rg.letters = int64(f[0][0]), int64(f[1][0]), true
	default:
		return rangeSpec{}, false, nil
	}
	rg.lo, rg.down = lo, hi < lo
	// The distance between the endpoints fits in a uint64 (two's complement).
	dist := uint64(hi) - uint64(lo)
	if rg.down {
		dist = uint64(lo) - uint64(hi)
	}
	rg.n = addSat(dist/rg.step, 1)
	return rg, true, nil
}

// value returns the i-th value of the range (i < n).
func (rg rangeSpec) value(i uint64) string {
	d := i * rg.step // at most the distance between the endpoints: no overflow
	v := int64(uint64(rg.lo) + d)
	if rg.down {
		v = int64(uint64(rg.lo) - d)
	}
	if rg.letters {
		return string(rune(v))
	}
	return pad(v, rg.width)
}

func absU(v int64) uint64 {
	if v < 0 {
		return uint64(-(v + 1)) + 1
	}
	return uint64(v)
}

// expandRange expands "a..b" or "a..b..step" (numbers or single letters).
func expandRange(body string) ([]string, bool, error) {
	rg, ok, err := parseRange(body)
	if err != nil || !ok {
		return nil, ok, err
	}
	if rg.n > MaxExpansion {
		return nil, false, fmt.Errorf("range {%s} has %s values, more than %d", body, formatCount(rg.n), MaxExpansion)
	}
	out := make([]string, 0, rg.n)
	for i := uint64(0); i < rg.n; i++ {
		out = append(out, rg.value(i))
	}
	return out, true, nil
}

func padded(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return len(s) > 1 && s[0] == '0'
}

func pad(v int64, width int) string {
	s := strconv.FormatUint(absU(v), 10)
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

// MaxHashPrefixes is the most key prefixes HashPrefix and a {hash:P} placeholder
// spread shards over: 65,536, four hexadecimal digits.
const MaxHashPrefixes = 1 << 16

// HashPrefix returns the key prefix of the shard named name among prefixes hashed
// prefixes, the directory a writer puts it in so that a dataset's keys spread over
// prefixes that an object store such as S3 scales separately
// (s3://bucket/HashPrefix("train-000123.tar", 16)/train-000123.tar). The rule, which
// a writer in any language reproduces, and which does not change, since data written
// under it would no longer be found:
//
//	h      = the first 8 bytes of SHA-256(name's UTF-8 bytes), a big-endian uint64
//	prefix = h mod prefixes, in lower-case hexadecimal, zero-padded to the number
//	         of hexadecimal digits of prefixes-1 (at least one)
//
// So 16 prefixes are "0" to "f", 256 are "00" to "ff", 100 are "00" to "63". name is
// the shard's base name, what follows the last "/" of its URL. In Python:
//
//	h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
//	prefix = format(h % prefixes, "x").zfill(len(format(prefixes - 1, "x")))
//
// HashPrefix panics unless 1 <= prefixes <= MaxHashPrefixes.
func HashPrefix(name string, prefixes int) string {
	var buf [8]byte
	return string(appendHashPrefix(buf[:0], []byte(name), prefixes))
}

// appendHashPrefix appends HashPrefix(name, prefixes) to dst.
func appendHashPrefix(dst, name []byte, prefixes int) []byte {
	if prefixes < 1 || prefixes > MaxHashPrefixes {
		panic(fmt.Sprintf("shard: HashPrefix over %d prefixes: want 1 to %d", prefixes, MaxHashPrefixes))
	}
	sum := sha256.Sum256(name)
	v := binary.BigEndian.Uint64(sum[:8]) % uint64(prefixes)
	var hex [8]byte
	digits := strconv.AppendUint(hex[:0], v, 16)
	for range hexWidth(prefixes) - len(digits) {
		dst = append(dst, '0')
	}
	return append(dst, digits...)
}

// hexWidth returns the hexadecimal digits of prefixes-1, at least one.
func hexWidth(prefixes int) int {
	return max(1, (bits.Len(uint(prefixes-1))+3)/4)
}

// hashPlaceholder parses the inside of a {hash:P} group: its P, and whether body is
// one (it starts with "hash:" and is no list: "{hash:4,x}" is one); a bad P is an
// error.
func hashPlaceholder(body string) (int, bool, error) {
	ps, ok := strings.CutPrefix(body, "hash:")
	if !ok || topLevel(body, ',') {
		return 0, false, nil
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 1 || p > MaxHashPrefixes || ps[0] < '1' || ps[0] > '9' {
		return 0, true, fmt.Errorf("{%s}: want {hash:P} with P a number of prefixes from 1 to %d", body, MaxHashPrefixes)
	}
	return p, true, nil
}

// checkHash checks the {hash:P} placeholders of a balanced pattern: a valid P, in no
// other group, and a "/" after each outside any group.
func checkHash(p string) error {
	if !strings.Contains(p, "{hash:") {
		return nil
	}
	depth := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '}':
			depth--
		case '{':
			_, close := findGroup(p, i)
			body := p[i+1 : close]
			_, ok, err := hashPlaceholder(body)
			switch {
			case err != nil:
				return err
			case ok && depth > 0:
				return fmt.Errorf("{%s} at byte %d is inside another group: a hashed prefix stands in a directory of the pattern, outside any group", body, i)
			case ok && !topLevel(p[close+1:], '/'):
				return fmt.Errorf("{%s} at byte %d has no \"/\" after it outside any group: a hashed prefix is a directory, derived from the shard's name after it", body, i)
			}
			depth++
		}
	}
	return nil
}

// topLevel reports whether s holds the byte c outside any brace group: a "," of a
// list, a "/" after a directory.
func topLevel(s string, c byte) bool {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
		case c:
			if depth == 0 {
				return true
			}
		}
	}
	return false
}

// fillHash replaces the {hash:P} placeholders of an expanded URL s (still escaped;
// checked by checkHash) with HashPrefix of the URL's name, what follows its last "/".
func fillHash(s string) string {
	var nameBuf [128]byte
	name := append(nameBuf[:0], unescape(s[strings.LastIndexByte(s, '/')+1:])...)
	var b strings.Builder
	var buf [8]byte
	last := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				continue
			}
			p, ok, err := hashPlaceholder(s[i+1 : i+end])
			if !ok || err != nil {
				continue
			}
			if last == 0 {
				b.Grow(len(s))
			}
			b.WriteString(s[last:i])
			b.Write(appendHashPrefix(buf[:0], name, p))
			last = i + end + 1
			i = last - 1
		}
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}
