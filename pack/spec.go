package pack

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxSeqLen is the longest row a Spec may ask for, in tokens.
const MaxSeqLen = 1 << 30

// Spec says how one field of the samples is packed: which field holds the documents,
// how many tokens a row has, and the ids written after each document (EOS) and into
// the tail of the epoch's last row (Pad). Its string form is
//
//	FIELD:SEQ_LEN[:eos=ID][:pad=ID]
//
// with the options in any order, each at most once. The zero Spec is not valid.
type Spec struct {
	// Field is the member extension holding the documents, such as "tokens.npy" or
	// "tokens". It may contain dots but not colons.
	Field string
	// SeqLen is the number of tokens in a row, in [1, MaxSeqLen].
	SeqLen int
	// HasEOS says an EOS token is appended after every document.
	HasEOS bool
	// EOS is the id appended after every document when HasEOS is set; without
	// HasEOS it is ignored (String leaves it out).
	EOS int64
	// Pad is the id filling the epoch's last row after its last document, and the
	// rows a rank reads past the epoch's end. ParseSpec sets it to EOS when the
	// spec gives eos and no pad, and to 0 when it gives neither.
	Pad int64
	// Int32 writes input_ids as int32 instead of int64 (the option ids=int32):
	// every token id, eos and pad must then fit. It changes the batches' dtype, not
	// the layout: a state of either resumes the other.
	Int32 bool
}

// ParseSpec parses FIELD:SEQ_LEN[:eos=ID][:pad=ID][:ids=int32]. SEQ_LEN and the ids
// are decimal numbers (digits only); pad defaults to eos when eos is given, else to
// 0; ids=int32 (or ids=int64, the default) is input_ids' dtype. It fails with
// ErrField, ErrSeqLen, ErrUnknownOption, ErrDuplicateOption or ErrBadID.
func ParseSpec(s string) (Spec, error) {
	parts := strings.Split(s, ":")
	if parts[0] == "" {
		return Spec{}, fmt.Errorf("%w: spec %q names no field", ErrField, s)
	}
	if len(parts) < 2 {
		return Spec{}, fmt.Errorf("%w: spec %q has no SEQ_LEN (want FIELD:SEQ_LEN[:eos=ID][:pad=ID])", ErrSeqLen, s)
	}
	n, ok := parseDigits(parts[1])
	if !ok || n < 1 || n > MaxSeqLen {
		return Spec{}, fmt.Errorf("%w %q in spec %q (want a number in [1, %d])", ErrSeqLen, parts[1], s, MaxSeqLen)
	}
	sp := Spec{Field: parts[0], SeqLen: int(n)}
	var seenEOS, seenPad, seenIDs bool
	for _, opt := range parts[2:] {
		key, val, _ := strings.Cut(opt, "=")
		var seen *bool
		switch {
		case key == "eos" && strings.Contains(opt, "="):
			seen = &seenEOS
		case key == "pad" && strings.Contains(opt, "="):
			seen = &seenPad
		case opt == "ids=int32" || opt == "ids=int64":
			seen = &seenIDs
		default:
			return Spec{}, fmt.Errorf("%w %q in spec %q (want eos=ID, pad=ID or ids=int32)", ErrUnknownOption, opt, s)
		}
		if *seen {
			return Spec{}, fmt.Errorf("%w %q in spec %q", ErrDuplicateOption, key, s)
		}
		*seen = true
		if key == "ids" {
			sp.Int32 = val == "int32"
			continue
		}
		id, err := parseID(val)
		if err != nil {
			return Spec{}, fmt.Errorf("%w: %s=%q in spec %q (%s)", ErrBadID, key, val, s, err)
		}
		if key == "eos" {
			sp.HasEOS, sp.EOS = true, id
		} else {
			sp.Pad = id
		}
	}
	if seenEOS && !seenPad {
		sp.Pad = sp.EOS
	}
	return sp, nil
}

// String gives the spec's canonical form, which ParseSpec parses back to the same
// Spec: FIELD:SEQ_LEN, then eos=ID when HasEOS, then pad=ID when Pad is not its
// default (EOS with eos, else 0), then ids=int32 when Int32.
func (s Spec) String() string {
	b := make([]byte, 0, len(s.Field)+48)
	b = append(b, s.Field...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(s.SeqLen), 10)
	def := int64(0)
	if s.HasEOS {
		b = append(b, ":eos="...)
		b = strconv.AppendInt(b, s.EOS, 10)
		def = s.EOS
	}
	if s.Pad != def {
		b = append(b, ":pad="...)
		b = strconv.AppendInt(b, s.Pad, 10)
	}
	if s.Int32 {
		b = append(b, ":ids=int32"...)
	}
	return string(b)
}

// Check reports whether the spec is valid (what ParseSpec accepts) and its eos and
// pad ids fit an output dtype whose largest id is maxID (math.MaxInt32 for int32
// input_ids). A misfit is ErrIDRange naming the spec.
func (s Spec) Check(maxID int64) error {
	if err := s.validate(); err != nil {
		return err
	}
	if s.HasEOS && s.EOS > maxID {
		return fmt.Errorf("%w: spec %q: eos %d is more than %d", ErrIDRange, s, s.EOS, maxID)
	}
	if s.Pad > maxID {
		return fmt.Errorf("%w: spec %q: pad %d is more than %d", ErrIDRange, s, s.Pad, maxID)
	}
	return nil
}

// validate checks what ParseSpec would have checked, for a Spec built by hand.
func (s Spec) validate() error {
	switch {
	case s.Field == "":
		return fmt.Errorf("%w: spec %q names no field", ErrField, s)
	case strings.Contains(s.Field, ":"):
		return fmt.Errorf("%w: field %q of spec %q holds a colon", ErrField, s.Field, s)
	case s.SeqLen < 1 || s.SeqLen > MaxSeqLen:
		return fmt.Errorf("%w %d in spec %q (want a number in [1, %d])", ErrSeqLen, s.SeqLen, s, MaxSeqLen)
	case s.HasEOS && s.EOS < 0:
		return fmt.Errorf("%w: negative eos %d in spec %q", ErrBadID, s.EOS, s)
	case s.Pad < 0:
		return fmt.Errorf("%w: negative pad %d in spec %q", ErrBadID, s.Pad, s)
	}
	return nil
}

// eosLen is the number of tokens the spec adds after each document: 1 with eos.
func (s Spec) eosLen() int64 {
	if s.HasEOS {
		return 1
	}
	return 0
}

// parseDigits parses a non-empty run of ASCII digits that fits in an int64.
func parseDigits(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// parseID parses a token id: digits only, so a negative id is refused by name.
func parseID(s string) (int64, error) {
	if strings.HasPrefix(s, "-") {
		if _, ok := parseDigits(s[1:]); ok {
			return 0, fmt.Errorf("negative")
		}
	}
	n, ok := parseDigits(s)
	if !ok {
		return 0, fmt.Errorf("not a number up to %d", int64(1<<63-1))
	}
	return n, nil
}
