package decode

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind is how a field's bytes are decoded. Its text form (String, ParseKind, field
// specs) is "raw", "npy", "int", "text", "json" or "image".
type Kind int

// The kinds of field. (The constants carry a Kind prefix because NPY is the name of
// the parsed-array type.)
const (
	// KindRaw keeps the member's bytes as they are (images, audio, anything the trainer
	// decodes itself). Ragged column.
	KindRaw Kind = iota
	// KindNPY parses a .npy array. Fixed-shape column when the Field has a Shape, else
	// ragged bytes of the array data.
	KindNPY
	// KindInt parses a decimal integer (a WebDataset .cls label). Fixed int64 column.
	KindInt
	// KindText checks that the bytes are UTF-8. Ragged column.
	KindText
	// KindJSON checks that the bytes are valid JSON and keeps them. Ragged column.
	KindJSON
	// KindImage decodes a JPEG, PNG, WebP or GIF image to RGB (or grayscale), resizes
	// and crops it as the Field's Image options say, into a fixed column of the
	// Field's Shape (HxWxC or CxHxW) and DType (uint8, float16 or float32).
	KindImage
)

var kindNames = [...]string{KindRaw: "raw", KindNPY: "npy", KindInt: "int", KindText: "text", KindJSON: "json", KindImage: "image"}

// String returns "raw", "npy", "int", "text", "json" or "image".
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// ParseKind parses the names String returns.
func ParseKind(s string) (Kind, error) {
	for k, n := range kindNames {
		if n == s {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("decode: unknown kind %q (want raw, npy, int, text, json or image)", s)
}

// MarshalText encodes k as its String.
func (k Kind) MarshalText() ([]byte, error) {
	if k < 0 || int(k) >= len(kindNames) {
		return nil, fmt.Errorf("decode: invalid kind %d", int(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText decodes what ParseKind accepts.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// DefaultMaxBytes is the cap on a gunzipped member's size when Field.MaxBytes is 0.
const DefaultMaxBytes = 256 << 20

// Field says which member of a sample to read and how to decode it. The zero value
// is not valid (it has no Ext); build Fields with ParseField or check them with
// Validate.
type Field struct {
	// Name is the column name in the batch; "" means Ext (see ColumnName). Names
	// starting with "__" are reserved for columns shardload adds (__key__).
	Name string
	// Ext is the sample extension the field is read from, lower-case, as shard.Field
	// reports it: "jpg", "cls", "seg.png", "txt.gz".
	Ext string
	// Kind is how the bytes are decoded.
	Kind Kind
	// Gunzip says the member is gzip-compressed: it is inflated before decoding.
	// ParseField sets it when Ext ends in ".gz".
	Gunzip bool
	// DType (NPY only) is the required element type; the zero DType accepts any.
	// For an image it is the output's type: uint8, float16 or float32.
	DType DType
	// Shape (NPY only) is the required per-sample shape. With a Shape the column is
	// fixed-size [rows, Shape...] of DType (so DType must be set too); without one
	// (nil or empty) the column holds ragged bytes. Every dimension must be positive;
	// 0-d (scalar) arrays can only be read as ragged. For an image it is the output's
	// shape, always set: [H, W, C] (HWC) or [C, H, W] (CHW), C being 3 (RGB) or 1
	// (grayscale).
	Shape []int
	// Image holds an image field's transforms (KindImage only).
	Image ImageOptions
	// MaxBytes caps the inflated size of a Gunzip member, against gzip bombs; 0 means
	// DefaultMaxBytes (256 MiB). For an image it caps the decoded RGB size
	// (width x height x 3) too, against decompression bombs.
	MaxBytes int64
}

// ColumnName returns Name, or Ext when Name is empty.
func (f *Field) ColumnName() string {
	if f.Name != "" {
		return f.Name
	}
	return f.Ext
}

func (f *Field) maxBytes() int64 {
	if f.MaxBytes > 0 {
		return f.MaxBytes
	}
	return DefaultMaxBytes
}

// fixed reports whether the field's column is fixed-size (Int, Image, or NPY with a
// Shape).
func (f *Field) fixed() bool {
	return f.Kind == KindInt || f.Kind == KindImage || f.Kind == KindNPY && len(f.Shape) > 0
}

// RowBytes returns the bytes one sample takes in the field's column when it is
// fixed-size (an Int, an Image, an NPY field with a Shape), and -1 when it is
// ragged.
func (f *Field) RowBytes() int64 {
	if !f.fixed() {
		return -1
	}
	if f.Kind == KindInt {
		return 8
	}
	n, _ := byteSize(f.Shape, f.DType.Size())
	return n
}

// ParseField parses a field spec, the syntax of the --field flag:
//
//	[NAME=]EXT[:KIND[:DTYPE[:SHAPE[:OPTIONS]]]]
//
// EXT is the sample extension (lower-cased). NAME is the column name; it defaults to
// EXT. KIND is raw, npy, int, text or json; it defaults from the last dot-separated
// part of EXT, after dropping a trailing ".gz": cls, label and id give int; txt and
// text give text; json gives json; npy gives npy; anything else gives raw. An EXT
// ending in ".gz" (or equal to "gz") sets Gunzip: the member is inflated first.
// DTYPE (npy only) is a NumPy name or descr ("float32", "<f4"); arrays of another
// dtype are rejected. SHAPE (npy only, needs DTYPE) is the per-sample shape written
// with x between dimensions ("3x224x224", or "128" for 1-D); it makes the column
// fixed-size, and arrays of another shape are rejected. Parts may not be empty.
//
// An image field (KIND image) decodes JPEG, PNG, WebP or GIF to a fixed-shape
// column: DTYPE is uint8 (the default), float16 or float32; SHAPE is HxWx3 (HWC, the
// default 224x224x3), 3xHxW (CHW), or HxWx1 / 1xHxW for grayscale; OPTIONS (only for
// images) is a comma-separated list of transforms, see ParseImageOptions; it may
// stand where SHAPE would, for the default shape ("img=jpg:image:float32:imagenet").
// Without
// options an image is resized (bilinear, antialiased, as PIL resizes) so that its
// shorter side is the crop's larger side, and center-cropped.
//
// Examples:
//
//	cls                          column "cls": int label from .cls
//	label=cls:int                column "label": int label from .cls
//	img=jpg                      column "img": raw bytes of .jpg
//	tokens=npy:npy:int32:2048    column "tokens": [rows, 2048] int32 from .npy
//	feats=npy:npy:float32        column "feats": ragged bytes of float32 .npy arrays
//	caption=txt.gz:text          column "caption": gunzipped UTF-8 text of .txt.gz
//	img=jpg:image:uint8:224x224x3              [rows, 224, 224, 3] uint8, center crop
//	img=jpg:image:uint8:3x224x224:resize=256   [rows, 3, 224, 224], resize 256, crop
//	img=jpg:image:float32:3x224x224:random-crop,flip,imagenet   training transforms
//
// Errors quote the spec, e.g. `decode: field "x=npy:npy:float32:3xq": bad shape "3xq"`,
// and wrap ErrInvalidField. The result passes Validate.
func ParseField(spec string) (Field, error) { return parseField(spec, false) }

// ParseFieldCHW is ParseField, except that an image field whose spec names no shape
// is 3x224x224 (CHW, as torchvision's tensors and models take them) instead of
// 224x224x3: what a trainer that hands batches to PyTorch asks for.
func ParseFieldCHW(spec string) (Field, error) { return parseField(spec, true) }

func parseField(spec string, chw bool) (Field, error) {
	bad := func(format string, args ...any) (Field, error) {
		return Field{}, &sentinelError{ErrInvalidField, fmt.Sprintf("decode: field %q: ", spec) + fmt.Sprintf(format, args...)}
	}
	var f Field
	parts := strings.Split(spec, ":")
	if len(parts) > 5 {
		return bad("too many parts (want [NAME=]EXT[:KIND[:DTYPE[:SHAPE[:OPTIONS]]]])")
	}
	for i, p := range parts {
		if p == "" {
			what := [...]string{"extension", "kind", "dtype", "shape", "options"}[i]
			return bad("empty %s", what)
		}
	}
	head := parts[0]
	if i := strings.IndexByte(head, '='); i >= 0 {
		f.Name, head = head[:i], head[i+1:]
		if f.Name == "" {
			return bad("empty name before '='")
		}
		if head == "" {
			return bad("empty extension")
		}
	}
	f.Ext = strings.ToLower(head)
	if f.Name == "" {
		f.Name = f.Ext
	}
	base := f.Ext
	if base == "gz" {
		base, f.Gunzip = "", true
	} else if b, ok := strings.CutSuffix(base, ".gz"); ok {
		base, f.Gunzip = b, true
	}
	f.Kind = defaultKind(base)
	if len(parts) > 1 {
		k, err := ParseKind(parts[1])
		if err != nil {
			return bad("unknown kind %q (want raw, npy, int, text, json or image)", parts[1])
		}
		f.Kind = k
	}
	if len(parts) > 4 && f.Kind != KindImage {
		return bad("options only apply to image fields, not %s", f.Kind)
	}
	if f.Kind == KindImage {
		f.DType, f.Shape = Uint8, []int{224, 224, 3}
		if chw {
			f.Shape = []int{3, 224, 224}
		}
	}
	if len(parts) > 2 {
		if f.Kind != KindNPY && f.Kind != KindImage {
			return bad("a dtype only applies to npy fields, not %s", f.Kind)
		}
		d, err := ParseDType(parts[2])
		if err != nil {
			return bad("bad dtype %q: %v", parts[2], strings.TrimPrefix(err.Error(), "decode: "))
		}
		f.DType = d
	}
	if len(parts) == 4 && f.Kind == KindImage {
		if _, ok := parseShape(parts[3]); !ok {
			if _, err := ParseImageOptions(parts[3]); err == nil {
				// img=jpg:image:float32:imagenet: options where the shape would be,
				// and the default shape.
				parts = append(parts[:3], "", parts[3])
			}
		}
	}
	if len(parts) > 3 && parts[3] != "" {
		shape, ok := parseShape(parts[3])
		if !ok {
			return bad("bad shape %q", parts[3])
		}
		f.Shape = shape
	}
	if len(parts) > 4 {
		opts, err := ParseImageOptions(parts[4])
		if err != nil {
			return bad("%v", strings.TrimPrefix(err.Error(), "decode: "))
		}
		f.Image = opts
	}
	if msg := f.check(); msg != "" {
		return bad("%s", msg)
	}
	return f, nil
}

// defaultKind picks a kind from an extension without its .gz.
func defaultKind(ext string) Kind {
	last := ext[strings.LastIndexByte(ext, '.')+1:]
	switch last {
	case "cls", "label", "id":
		return KindInt
	case "txt", "text":
		return KindText
	case "json":
		return KindJSON
	case "npy":
		return KindNPY
	}
	return KindRaw
}

// parseShape parses "3x224x224" or "128": positive decimal dimensions.
func parseShape(s string) ([]int, bool) {
	dims := strings.Split(s, "x")
	if len(dims) > MaxDims {
		return nil, false
	}
	shape := make([]int, len(dims))
	for i, d := range dims {
		if d == "" || len(d) > 18 || d[0] == '0' {
			return nil, false
		}
		n := 0
		for _, c := range []byte(d) {
			if c < '0' || c > '9' {
				return nil, false
			}
			n = n*10 + int(c-'0')
		}
		shape[i] = n
	}
	return shape, true
}

// String returns the field's spec in ParseField's syntax, with the kind always
// written: "label=cls:int", "tokens=npy:npy:int32:2048",
// "img=jpg:image:uint8:224x224x3:flip". Gunzip and MaxBytes are not part of the
// syntax (Gunzip follows from Ext).
func (f Field) String() string {
	var b strings.Builder
	if f.Name != "" && f.Name != f.Ext {
		b.WriteString(f.Name)
		b.WriteByte('=')
	}
	b.WriteString(f.Ext)
	b.WriteByte(':')
	b.WriteString(f.Kind.String())
	if !f.DType.IsZero() || len(f.Shape) > 0 {
		b.WriteByte(':')
		b.WriteString(f.DType.Name())
	}
	if len(f.Shape) > 0 {
		b.WriteByte(':')
		for i, d := range f.Shape {
			if i > 0 {
				b.WriteByte('x')
			}
			b.WriteString(strconv.Itoa(d))
		}
	}
	if opts := f.Image.String(); opts != "" {
		b.WriteByte(':')
		b.WriteString(opts)
	}
	return b.String()
}

// ParseFields parses each spec with ParseField and checks the fields together with
// Validate (column names must be distinct).
func ParseFields(specs ...string) ([]Field, error) { return parseFields(specs, false) }

// ParseFieldsCHW is ParseFields with ParseFieldCHW's image default.
func ParseFieldsCHW(specs ...string) ([]Field, error) { return parseFields(specs, true) }

func parseFields(specs []string, chw bool) ([]Field, error) {
	fields := make([]Field, 0, len(specs))
	for _, spec := range specs {
		f, err := parseField(spec, chw)
		if err != nil {
			return nil, err
		}
		fields = append(fields, f)
	}
	if err := Validate(fields...); err != nil {
		return nil, err
	}
	return fields, nil
}

// Validate checks fields: each must have a valid lower-case Ext and column name, a
// known Kind, DType and Shape only on NPY fields, a DType with every Shape, positive
// dimensions whose byte size does not overflow, and MaxBytes >= 0; column names must
// be distinct. Errors wrap ErrInvalidField and name the field.
func Validate(fields ...Field) error {
	for i := range fields {
		f := &fields[i]
		if msg := f.check(); msg != "" {
			return &sentinelError{ErrInvalidField, fmt.Sprintf("decode: field %q: %s", f.String(), msg)}
		}
		for j := range i {
			if fields[j].ColumnName() == f.ColumnName() {
				return &sentinelError{ErrInvalidField, fmt.Sprintf("decode: two fields named %q", f.ColumnName())}
			}
		}
	}
	return nil
}

// check returns what is wrong with f, or "".
func (f *Field) check() string {
	if f.Ext == "" {
		return "empty extension"
	}
	if msg := checkName(f.Ext); msg != "" {
		return "extension " + msg
	}
	if strings.ToLower(f.Ext) != f.Ext {
		return "extension " + strconv.Quote(f.Ext) + " is not lower-case"
	}
	if f.Ext[0] == '.' || f.Ext[len(f.Ext)-1] == '.' || strings.Contains(f.Ext, "..") || strings.ContainsRune(f.Ext, '/') {
		return "bad extension " + strconv.Quote(f.Ext)
	}
	name := f.ColumnName()
	if msg := checkName(name); msg != "" {
		return "name " + msg
	}
	if strings.HasPrefix(name, "__") {
		return "name " + strconv.Quote(name) + " is reserved (names starting with __ are shardload's)"
	}
	if f.Kind < 0 || int(f.Kind) >= len(kindNames) {
		return "invalid kind " + strconv.Itoa(int(f.Kind))
	}
	if f.Kind == KindImage {
		return f.checkImage()
	}
	if f.Image != (ImageOptions{}) {
		return "image options only apply to image fields, not " + f.Kind.String()
	}
	if f.Kind != KindNPY && !f.DType.IsZero() {
		return "a dtype only applies to npy fields, not " + f.Kind.String()
	}
	if f.Kind != KindNPY && len(f.Shape) > 0 {
		return "a shape only applies to npy fields, not " + f.Kind.String()
	}
	if len(f.Shape) > 0 {
		if f.DType.IsZero() {
			return "a shape needs a dtype (e.g. tokens=npy:npy:int32:2048)"
		}
		if len(f.Shape) > MaxDims {
			return fmt.Sprintf("shape has more than %d dimensions", MaxDims)
		}
		for _, d := range f.Shape {
			if d <= 0 {
				return "shape " + FormatShape(f.Shape) + " has a dimension that is not positive"
			}
		}
		if _, ok := byteSize(f.Shape, f.DType.Size()); !ok {
			return "shape " + FormatShape(f.Shape) + " is too large"
		}
	}
	if f.MaxBytes < 0 {
		return "negative MaxBytes"
	}
	return ""
}

// checkName rejects empty names and names with separators, spaces or control bytes.
func checkName(s string) string {
	if s == "" {
		return "is empty"
	}
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%q is not UTF-8", s)
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c == 0x7f || c == ':' || c == '=' || c == ',' {
			return fmt.Sprintf("%q has a forbidden character %q", s, c)
		}
	}
	return ""
}
