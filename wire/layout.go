package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/mem"
)

// Align is the alignment in bytes of every column's data and of every ragged
// column's offsets array, counted from the start of the slab. Slabs from package
// pinned are page-aligned, so the columns are then 64-byte aligned in memory too.
const Align = 64

// KeyColumn is the name of the ragged column Collate adds after the fields' columns,
// holding each sample's key as UTF-8 bytes.
const KeyColumn = "__key__"

// Column describes where one column of a batch lies in the slab, in the terms a
// NumPy view needs.
//
// A fixed column holds rows equal-size elements back to back: element i is at
// Offset + i*Length/rows. A ragged column holds rows variable-length items back to
// back at Offset, and rows+1 little-endian int64 offsets at OffsetsOffset: item i is
// slab[Offset+offsets[i] : Offset+offsets[i+1]], offsets[0] = 0 and
// offsets[rows] = Length.
type Column struct {
	// Name is the field's column name, or KeyColumn.
	Name string
	// Kind is the field's kind; KindText for the key column.
	Kind decode.Kind
	// Ragged says the column is variable-length (offsets plus bytes).
	Ragged bool
	// DType is the element type: a fixed NPY field's dtype, int64 for KindInt
	// fields, uint8 for ragged columns.
	DType decode.DType
	// Shape is [rows, per-sample shape...] for a fixed column ([rows] for KindInt)
	// and [Length] (total bytes) for a ragged one.
	Shape []int
	// Offset is the byte offset of the column's data in the slab; a multiple of
	// Align.
	Offset int64
	// Length is the number of bytes of data.
	Length int64
	// OffsetsOffset (ragged only) is the byte offset in the slab (not relative to
	// Offset) of the rows+1 int64 offsets; a multiple of Align. The offsets
	// themselves count bytes from Offset. Zero for a fixed column.
	OffsetsOffset int64
}

// Layout is where one collated batch lies in its slab.
type Layout struct {
	// Rows is the number of samples.
	Rows int
	// Columns holds one column per field, in the order of the fields, then the
	// KeyColumn.
	Columns []Column
	// Used is the number of bytes of the slab the batch occupies, from its start.
	Used int64
}

// FixedBytes is what a batch of rows takes in a slab besides its ragged columns'
// bytes: the fixed columns, every ragged column's offsets, keys of up to 64 bytes,
// and each column's alignment.
func FixedBytes(rows int, fields []decode.Field) int64 {
	n := int64(rows) * 64 // keys
	for i := range fields {
		if rb := fields[i].RowBytes(); rb >= 0 {
			n += int64(rows) * rb
		} else {
			n += 8 * int64(rows+1)
		}
		n += 2 * Align
	}
	return n + 8*int64(rows+1) + 2*Align
}

// Keys returns the samples' keys of a batch in slab, in row order (its KeyColumn).
func (b *Layout) Keys(slab []byte) []string {
	c, ok := b.Column(KeyColumn)
	if !ok {
		return nil
	}
	keys := make([]string, b.Rows)
	for i := range keys {
		keys[i] = string(c.Row(slab, i))
	}
	return keys
}

// Column returns the column called name.
func (b *Layout) Column(name string) (*Column, bool) {
	for i := range b.Columns {
		if b.Columns[i].Name == name {
			return &b.Columns[i], true
		}
	}
	return nil, false
}

// Row returns the bytes of row i of the column in slab (aliasing it): the i-th
// element of a fixed column, the i-th item of a ragged one. i must be less than the
// batch's Rows.
func (c *Column) Row(slab []byte, i int) []byte {
	var start, end int64
	if c.Ragged {
		o := slab[c.OffsetsOffset+8*int64(i):]
		start = c.Offset + int64(binary.LittleEndian.Uint64(o))
		end = c.Offset + int64(binary.LittleEndian.Uint64(o[8:]))
	} else {
		if i < 0 || len(c.Shape) == 0 || i >= c.Shape[0] {
			panic(fmt.Sprintf("decode: row %d of column %q out of range", i, c.Name))
		}
		n := c.Length / int64(c.Shape[0])
		start = c.Offset + int64(i)*n
		end = start + n
	}
	return slab[start:end:end]
}

// Offsets returns a copy of a ragged column's rows+1 offsets (nil for a fixed
// column); rows is the batch's Rows.
func (c *Column) Offsets(slab []byte, rows int) []int64 {
	if !c.Ragged {
		return nil
	}
	out := make([]int64, rows+1)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(slab[c.OffsetsOffset+8*int64(i):]))
	}
	return out
}

// Int64s returns a copy of the values of a fixed int64 column (a KindInt field, or
// an NPY field of dtype int64), flattened; nil for any other column.
func (c *Column) Int64s(slab []byte) []int64 {
	if c.Ragged || c.DType != decode.Int64 {
		return nil
	}
	data := slab[c.Offset : c.Offset+c.Length]
	out := make([]int64, len(data)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(data[8*i:]))
	}
	return out
}

func alignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// Needed returns the bytes of slab that Collate would use for this batch
// (Batch.Used), or -1 when Collate would reject the input for another reason than
// the slab's size.
func Needed(fields []decode.Field, keys []string, rows [][]decode.Value) int64 {
	n, err := layout(nil, fields, keys, rows)
	if err != nil {
		return -1
	}
	return n
}

// Collate writes a batch into slab and returns its layout. rows[i][j] is the value
// of fields[j] for the i-th sample, as Decode returned it, and keys[i] is the
// sample's key. See CollateInto.
func Collate(slab []byte, fields []decode.Field, keys []string, rows [][]decode.Value) (Layout, error) {
	var b Layout
	if err := CollateInto(&b, slab, fields, keys, rows); err != nil {
		return Layout{}, err
	}
	return b, nil
}

// CollateInto is Collate that refills b, reusing its Columns and their Shapes, so
// that collating a batch does not allocate in the steady state. b's previous
// contents are overwritten; on error they are unspecified.
//
// Columns, in order: one per field, then KeyColumn. A KindInt field gives a fixed
// int64 column of shape [rows]; an NPY field with a Shape a fixed column
// [rows, Shape...] of its DType; any other field (raw, text, json, NPY without a
// Shape: the array data without header) a ragged column of bytes. Every column's
// data and every offsets array starts at a multiple of Align from the start of
// slab; the padding between them is zeroed. The fields must pass Validate.
//
// Sizes are computed before anything is written: if the batch needs more than
// len(slab) bytes the error wraps ErrSlabTooSmall, says how many bytes were needed,
// and slab is left untouched. A fixed NPY value whose data size, dtype or shape
// does not fit its field gives a *FieldError wrapping ErrWrongShape or
// ErrWrongDType, also before anything is written.
func CollateInto(b *Layout, slab []byte, fields []decode.Field, keys []string, rows [][]decode.Value) error {
	nc := len(fields) + 1
	if cap(b.Columns) < nc {
		b.Columns = slices.Grow(b.Columns[:0], nc)
	}
	b.Columns = b.Columns[:nc]
	b.Rows = len(rows)
	used, err := layout(b.Columns, fields, keys, rows)
	if err != nil {
		return err
	}
	b.Used = used
	if used > int64(len(slab)) {
		return fmt.Errorf("%w: needs %d bytes, slab has %d (raise the slab size, --slab-size)", ErrSlabTooSmall, used, len(slab))
	}
	slab = slab[:used]
	var prev int64
	for j := range b.Columns {
		c := &b.Columns[j]
		if c.Ragged {
			clear(slab[prev:c.OffsetsOffset])
			offs := slab[c.OffsetsOffset : c.OffsetsOffset+8*int64(len(rows)+1)]
			clear(slab[c.OffsetsOffset+int64(len(offs)) : c.Offset])
			data := slab[c.Offset : c.Offset+c.Length]
			var o int
			binary.LittleEndian.PutUint64(offs, 0)
			for i := range rows {
				if j < len(fields) {
					o += put(data[o:], rows[i][j].Data)
				} else {
					o += copy(data[o:], keys[i])
				}
				binary.LittleEndian.PutUint64(offs[8*(i+1):], uint64(o))
			}
		} else {
			clear(slab[prev:c.Offset])
			data := slab[c.Offset : c.Offset+c.Length]
			if fields[j].Kind == decode.KindInt {
				for i := range rows {
					binary.LittleEndian.PutUint64(data[8*i:], uint64(rows[i][j].Int))
				}
			} else {
				var o int
				for i := range rows {
					o += put(data[o:], rows[i][j].Data)
				}
			}
		}
		prev = c.Offset + c.Length
	}
	return nil
}

// put copies v to the front of dst, unless it lies there already (read straight into
// its row, see InPlace), and returns its length.
func put(dst, v []byte) int {
	if len(v) > 0 && unsafe.SliceData(dst) == unsafe.SliceData(v) {
		return len(v)
	}
	return mem.CopyOut(dst, v)
}

// InPlace reports whether every value of rows whose bytes lie in slab lies where
// CollateInto would put it, or is a view of such a value of its row (two fields of
// one member), so that collating into slab copies the others only and overwrites
// none of them: a loader that read values straight into their rows of slab (from the
// sizes an index gives) calls it before Collate, and when it reports false moves
// those values out of slab first. It reports false too when such values exist and
// the batch does not fit slab, or the input is not one Collate accepts.
func InPlace(slab []byte, fields []decode.Field, keys []string, rows [][]decode.Value) bool {
	cols := make([]Column, len(fields)+1)
	used, err := layout(cols, fields, keys, rows)
	if err != nil || used > int64(len(slab)) {
		return !anyWithin(slab, fields, rows)
	}
	// placed[i*len(fields)+j]: row i's value of field j lies at its place.
	placed := make([]bool, len(rows)*len(fields))
	stray := false
	for j := range fields {
		c := &cols[j]
		o := c.Offset
		for i := range rows {
			v := rows[i][j].Data
			if inside(v, slab) {
				if unsafe.SliceData(v) == unsafe.SliceData(slab[o:]) {
					placed[i*len(fields)+j] = true
				} else {
					stray = true
				}
			}
			if c.Ragged {
				o += int64(len(v))
			} else {
				o += c.Length / int64(len(rows))
			}
		}
	}
	if !stray {
		return true
	}
	for i := range rows {
		for j := range fields {
			v := rows[i][j].Data
			if !inside(v, slab) || placed[i*len(fields)+j] {
				continue
			}
			ok := false
			for k := range fields {
				w := rows[i][k].Data
				if placed[i*len(fields)+k] && inside(v, w) {
					ok = true
					break
				}
			}
			if !ok {
				return false
			}
		}
	}
	return true
}

// anyWithin reports whether any value of rows lies in slab.
func anyWithin(slab []byte, fields []decode.Field, rows [][]decode.Value) bool {
	for i := range rows {
		for j := range min(len(fields), len(rows[i])) {
			if inside(rows[i][j].Data, slab) {
				return true
			}
		}
	}
	return false
}

// layout checks the batch and computes its columns into cols (when not nil, of
// length len(fields)+1); it returns the bytes used.
func layout(cols []Column, fields []decode.Field, keys []string, rows [][]decode.Value) (int64, error) {
	n := len(rows)
	if len(keys) != n {
		return 0, fmt.Errorf("decode: collate: %d keys for %d rows", len(keys), n)
	}
	for i := range rows {
		if len(rows[i]) != len(fields) {
			return 0, fmt.Errorf("decode: collate: row %d has %d values for %d fields", i, len(rows[i]), len(fields))
		}
	}
	var cur int64
	for j := range len(fields) + 1 {
		var f *decode.Field
		if j < len(fields) {
			f = &fields[j]
		}
		var c Column
		if f != nil && f.RowBytes() >= 0 {
			rb := f.RowBytes()
			if f.Kind == decode.KindNPY {
				for i := range rows {
					if err := checkFixed(f, &rows[i][j], rb); err != nil {
						return 0, err
					}
				}
			}
			c = place(cur, f, n, 0)
		} else {
			var total int64
			if f != nil {
				for i := range rows {
					total += int64(len(rows[i][j].Data))
				}
			} else {
				for _, k := range keys {
					total += int64(len(k))
				}
			}
			c = place(cur, f, n, total)
		}
		cur = c.Offset + c.Length
		if cols == nil {
			continue
		}
		col := &cols[j]
		shape := col.Shape[:0]
		col.Offset, col.Length, col.OffsetsOffset = c.Offset, c.Length, c.OffsetsOffset
		switch {
		case f == nil:
			col.Name, col.Kind, col.Ragged, col.DType = KeyColumn, decode.KindText, true, decode.Uint8
			shape = append(shape, int(c.Length))
		case f.Kind == decode.KindInt:
			col.Name, col.Kind, col.Ragged, col.DType = f.ColumnName(), decode.KindInt, false, decode.Int64
			shape = append(shape, n)
		case f.RowBytes() >= 0:
			col.Name, col.Kind, col.Ragged, col.DType = f.ColumnName(), f.Kind, false, f.DType
			shape = append(shape, n)
			shape = append(shape, f.Shape...)
		default:
			col.Name, col.Kind, col.Ragged, col.DType = f.ColumnName(), f.Kind, true, decode.Uint8
			shape = append(shape, int(c.Length))
		}
		col.Shape = shape
	}
	return cur, nil
}

// place returns where the column of field f (the key column when nil) lies in a
// batch of n rows after the cur bytes of the columns before it, its data being total
// bytes when it is ragged.
func place(cur int64, f *decode.Field, n int, total int64) Column {
	var c Column
	if f != nil && f.RowBytes() >= 0 {
		c.Offset = alignUp(cur)
		c.Length = f.RowBytes() * int64(n)
		return c
	}
	c.OffsetsOffset = alignUp(cur)
	c.Offset = alignUp(c.OffsetsOffset + 8*int64(n+1))
	c.Length = total
	return c
}

// PlanColumns computes where the first columns of a batch of n rows will lie, before
// its values are known, from the bytes of each ragged field's column (totals[j]; a
// fixed column's are its RowBytes times n, whatever totals says): offsets[j] is
// where column j's data starts in the slab, as Collate will put it. It plans the
// columns up to the first ragged one whose total is negative (not known) and returns
// how many, and the bytes they take.
func PlanColumns(offsets []int64, fields []decode.Field, n int, totals []int64) (int, int64) {
	var cur int64
	for j := range fields {
		f := &fields[j]
		if f.RowBytes() < 0 && totals[j] < 0 {
			return j, cur
		}
		c := place(cur, f, n, totals[j])
		offsets[j] = c.Offset
		cur = c.Offset + c.Length
	}
	return len(fields), cur
}

// checkFixed checks that a value fits a fixed NPY column.
func checkFixed(f *decode.Field, v *decode.Value, rowBytes int64) error {
	bad := func(sentinel error, format string, args ...any) error {
		return &decode.FieldError{Field: f.ColumnName(), Ext: f.Ext, Err: fmt.Errorf("%w: collate: "+format, append([]any{sentinel}, args...)...)}
	}
	if !v.DType.IsZero() && v.DType != f.DType {
		return bad(decode.ErrWrongDType, "got %s, want %s", v.DType.Name(), f.DType.Name())
	}
	if v.Shape != nil && !slices.Equal(v.Shape, f.Shape) {
		return bad(decode.ErrWrongShape, "got %s, want %s", decode.FormatShape(v.Shape), decode.FormatShape(f.Shape))
	}
	if int64(len(v.Data)) != rowBytes {
		return bad(decode.ErrWrongShape, "%d data bytes, want %d for %s %s", len(v.Data), rowBytes, decode.FormatShape(f.Shape), f.DType.Name())
	}
	return nil
}

// ErrSlabTooSmall means a batch does not fit in the slab given to Collate.
var ErrSlabTooSmall = errors.New("wire: batch does not fit in the slab")

// inside reports whether v, not empty, lies inside buf.
func inside(v, buf []byte) bool {
	_, ok := mem.Within(v, buf)
	return ok
}
