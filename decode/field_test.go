package decode

import (
	"reflect"
	"slices"
	"testing"
)

func TestParseField(t *testing.T) {
	cases := []struct {
		spec string
		want Field
	}{
		{"cls", Field{Name: "cls", Ext: "cls", Kind: KindInt}},
		{"label=cls:int", Field{Name: "label", Ext: "cls", Kind: KindInt}},
		{"img=jpg", Field{Name: "img", Ext: "jpg", Kind: KindRaw}},
		{"jpg", Field{Name: "jpg", Ext: "jpg", Kind: KindRaw}},
		{"IMG=JPG", Field{Name: "IMG", Ext: "jpg", Kind: KindRaw}},
		{"tokens=npy:npy:int32:2048", Field{Name: "tokens", Ext: "npy", Kind: KindNPY, DType: Int32, Shape: []int{2048}}},
		{"x=npy:npy:<f4:3x224x224", Field{Name: "x", Ext: "npy", Kind: KindNPY, DType: Float32, Shape: []int{3, 224, 224}}},
		{"feats=npy:npy:float32", Field{Name: "feats", Ext: "npy", Kind: KindNPY, DType: Float32}},
		{"npy", Field{Name: "npy", Ext: "npy", Kind: KindNPY}},
		{"caption=txt.gz:text", Field{Name: "caption", Ext: "txt.gz", Kind: KindText, Gunzip: true}},
		{"txt.gz", Field{Name: "txt.gz", Ext: "txt.gz", Kind: KindText, Gunzip: true}},
		{"meta=json.gz", Field{Name: "meta", Ext: "json.gz", Kind: KindJSON, Gunzip: true}},
		{"a=npy.gz:npy:uint8:4", Field{Name: "a", Ext: "npy.gz", Kind: KindNPY, Gunzip: true, DType: Uint8, Shape: []int{4}}},
		{"blob=gz", Field{Name: "blob", Ext: "gz", Kind: KindRaw, Gunzip: true}},
		{"seg=seg.png", Field{Name: "seg", Ext: "seg.png", Kind: KindRaw}},
		{"m=meta.json", Field{Name: "m", Ext: "meta.json", Kind: KindJSON}},
		{"label", Field{Name: "label", Ext: "label", Kind: KindInt}},
		{"id", Field{Name: "id", Ext: "id", Kind: KindInt}},
		{"text", Field{Name: "text", Ext: "text", Kind: KindText}},
		{"txt:raw", Field{Name: "txt", Ext: "txt", Kind: KindRaw}},
		{"c=cls:text", Field{Name: "c", Ext: "cls", Kind: KindText}},
		{"json", Field{Name: "json", Ext: "json", Kind: KindJSON}},
		{"gzip=txt.gzip", Field{Name: "gzip", Ext: "txt.gzip", Kind: KindRaw}},
		{"a.b=x", Field{Name: "a.b", Ext: "x", Kind: KindRaw}},
	}
	for _, c := range cases {
		got, err := ParseField(c.spec)
		if err != nil {
			t.Errorf("ParseField(%q): %v", c.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseField(%q) = %+v, want %+v", c.spec, got, c.want)
		}
		if err := Validate(got); err != nil {
			t.Errorf("Validate(ParseField(%q)): %v", c.spec, err)
		}
		back, err := ParseField(got.String())
		if err != nil || !reflect.DeepEqual(back, got) {
			t.Errorf("ParseField(%q.String() = %q) = %+v, %v", c.spec, got.String(), back, err)
		}
	}
}

func TestParseFieldErrors(t *testing.T) {
	cases := []struct{ spec, msg string }{
		{"x=npy:npy:float32:3xq", `decode: field "x=npy:npy:float32:3xq": bad shape "3xq"`},
		{"x=npy:npy:float32:3x", `bad shape "3x"`},
		{"x=npy:npy:float32:0", `bad shape "0"`},
		{"x=npy:npy:float32:03", `bad shape "03"`},
		{"x=npy:npy:float32:-3", `bad shape "-3"`},
		{"x=npy:npy:float32:3X4", `bad shape "3X4"`},
		{"x=npy:npy:float32:9999999999999999999", `bad shape`},
		{"x=npy:npy:float32:4294967296x4294967296", `is too large`},
		{"", `empty extension`},
		{"=cls", `empty name before '='`},
		{"x=", `empty extension`},
		{"x=:int", `empty extension`},
		{"cls:", `empty kind`},
		{"npy:npy:", `empty dtype`},
		{"npy:npy:float32:", `empty shape`},
		{"a=npy:npy:int32:4:5", `options only apply to image fields, not npy`},
		{"a=jpg:image:uint8:4x4x3:flip:x", `too many parts`},
		{"a=jpg:image:int32", `image's dtype must be uint8, float16 or float32`},
		{"a=jpg:image:uint8:4x4x4", `shape must be HxWx3`},
		{"a=jpg:image:uint8:224x224x3:resize=100", `resize=100 is smaller than the 224x224 crop`},
		{"a=jpg:image:uint8:224x224x3:random-crop,resize=256", `resize applies to the center crop`},
		{"a=jpg:image:uint8:224x224x3:scale=0.1-1", `scale and ratio apply to random-crop`},
		{"a=jpg:image:uint8:224x224x3:random-crop,scale=0.5-0.1", `scale must be A-B`},
		{"a=jpg:image:uint8:224x224x3:imagenet", `need a float dtype`},
		{"a=jpg:image:float32:224x224x3:mean=0.5", `mean needs std`},
		{"a=jpg:image:float32:224x224x3:mean=0.5,std=0", `mean needs std`},
		{"a=jpg:image:float32:224x224x3:std=0.5/0/1", `std must be positive`},
		{"a=jpg:image:float32:224x224x1:imagenet", `grayscale image takes one mean`},
		{"a=jpg:image:uint8:224x224x3:flip,flip", `flip given twice`},
		{"a=jpg:image:uint8:224x224x3:flip=1", `flip takes no value`},
		{"a=jpg:image:uint8:224x224x3:resize", `resize needs a value`},
		{"a=jpg:image:uint8:224x224x3:blur", `unknown option "blur"`},
		{"a=jpg:raw:uint8", `a dtype only applies to npy fields`},
		{"a=cls:integer", `unknown kind "integer"`},
		{"a=cls:int:int32", `a dtype only applies to npy fields, not int`},
		{"a=jpg:raw:uint8", `a dtype only applies to npy fields, not raw`},
		{"a=npy:npy:>f4", `big-endian dtype ">f4" not supported`},
		{"a=npy:npy:float128", `bad dtype "float128"`},
		{"a=npy:npy:any:4", `bad dtype "any"`},
		{"__key__=txt", `is reserved`},
		{"__url__=txt", `is reserved`},
		{"my label=cls", `forbidden character ' '`},
		{"a,b=cls", `forbidden character ','`},
		{"a=b=cls", `extension "b=cls" has a forbidden character '='`},
		{"a=dir/x.jpg", `bad extension`},
		{"a=.jpg", `bad extension`},
		{"a=jpg.", `bad extension`},
		{"a=seg..png", `bad extension`},
		{"a=j\tpg", `forbidden character`},
		{"a\xff=jpg", `not UTF-8`},
	}
	for _, c := range cases {
		_, err := ParseField(c.spec)
		if err == nil {
			t.Errorf("ParseField(%q) succeeded", c.spec)
			continue
		}
		t.Run(c.spec, func(t *testing.T) { wantErr(t, err, ErrInvalidField, c.msg) })
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name   string
		fields []Field
		msg    string // "" means valid
	}{
		{"ok", []Field{{Ext: "cls", Kind: KindInt}, {Name: "img", Ext: "jpg"}}, ""},
		{"no fields", nil, ""},
		{"shape without dtype", []Field{{Ext: "npy", Kind: KindNPY, Shape: []int{4}}}, "a shape needs a dtype"},
		{"zero dim", []Field{{Ext: "npy", Kind: KindNPY, DType: Int8, Shape: []int{4, 0}}}, "not positive"},
		{"shape on raw", []Field{{Ext: "bin", Shape: []int{4}}}, "a shape only applies to npy fields"},
		{"dtype on int", []Field{{Ext: "cls", Kind: KindInt, DType: Int64}}, "a dtype only applies to npy fields, not int"},
		{"no ext", []Field{{Name: "x"}}, "empty extension"},
		{"upper-case ext", []Field{{Ext: "JPG"}}, "not lower-case"},
		{"bad kind", []Field{{Ext: "x", Kind: Kind(9)}}, "invalid kind 9"},
		{"negative MaxBytes", []Field{{Ext: "txt.gz", Gunzip: true, MaxBytes: -1}}, "negative MaxBytes"},
		{"duplicate names", []Field{{Ext: "cls", Kind: KindInt}, {Name: "cls", Ext: "txt"}}, `two fields named "cls"`},
		{"duplicate ext, distinct names", []Field{{Name: "a", Ext: "cls"}, {Name: "b", Ext: "cls"}}, ""},
		{"reserved name", []Field{{Name: "__key__", Ext: "txt"}}, "reserved"},
		{"too many dims", []Field{{Ext: "npy", Kind: KindNPY, DType: Int8, Shape: make([]int, 65)}}, "more than 64 dimensions"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.fields...)
			if c.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, ErrInvalidField, c.msg)
		})
	}
}

func TestKind(t *testing.T) {
	for k, s := range map[Kind]string{KindRaw: "raw", KindNPY: "npy", KindInt: "int", KindText: "text", KindJSON: "json"} {
		if k.String() != s {
			t.Errorf("%d.String() = %q, want %q", int(k), k.String(), s)
		}
		got, err := ParseKind(s)
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", s, got, err)
		}
	}
	if Kind(7).String() != "Kind(7)" {
		t.Errorf("Kind(7).String() = %q", Kind(7).String())
	}
	if _, err := Kind(7).MarshalText(); err == nil {
		t.Error("Kind(7).MarshalText succeeded")
	}
	if _, err := ParseKind("NPY"); err == nil {
		t.Error(`ParseKind("NPY") succeeded`)
	}
}

func TestColumnName(t *testing.T) {
	f := Field{Ext: "cls", Kind: KindInt}
	if f.ColumnName() != "cls" || f.String() != "cls:int" {
		t.Fatalf("ColumnName %q String %q", f.ColumnName(), f.String())
	}
	f.Name = "label"
	if f.ColumnName() != "label" || f.String() != "label=cls:int" {
		t.Fatalf("ColumnName %q String %q", f.ColumnName(), f.String())
	}
}

func TestParseFields(t *testing.T) {
	fs, err := ParseFields("jpg", "label=cls:int", "tokens=npy:npy:int32:2048")
	if err != nil || len(fs) != 3 || fs[1].ColumnName() != "label" || fs[2].Kind != KindNPY {
		t.Fatalf("ParseFields = %+v, %v", fs, err)
	}
	_, err = ParseFields("jpg", "x=npy:npy:float32:3xq")
	wantErr(t, err, ErrInvalidField, `"x=npy:npy:float32:3xq"`)
	_, err = ParseFields("a=jpg", "a=png")
	wantErr(t, err, ErrInvalidField, `"a"`)
}

// For a trainer that hands batches to PyTorch, an image field with no shape is CHW;
// a shape given stays as given, and other fields are as ParseField makes them.
func TestParseFieldsCHW(t *testing.T) {
	fs, err := ParseFieldsCHW("img=jpg:image", "f=jpg:image:float32:::imagenet", "hwc=png:image:uint8:64x64x3", "label=cls", "jpg")
	if err == nil {
		t.Fatalf("empty parts were accepted: %+v", fs)
	}
	fs, err = ParseFieldsCHW("img=jpg:image", "f=jpg:image:float32", "hwc=png:image:uint8:64x64x3", "label=cls", "jpg")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]int{{3, 224, 224}, {3, 224, 224}, {64, 64, 3}, nil, nil} {
		if !slices.Equal(fs[i].Shape, want) {
			t.Errorf("%s: shape %v, want %v", fs[i].String(), fs[i].Shape, want)
		}
	}
	plain, _ := ParseFields("img=jpg:image")
	if !slices.Equal(plain[0].Shape, []int{224, 224, 3}) {
		t.Errorf("ParseFields: image shape %v, want HWC", plain[0].Shape)
	}
	// Options where the shape would be: the default shape, and the options.
	opt, err := ParseFieldsCHW("img=jpg:image:float32:imagenet,flip")
	if err != nil || !slices.Equal(opt[0].Shape, []int{3, 224, 224}) || !opt[0].Image.Flip || opt[0].Image.Std == [3]float64{} {
		t.Errorf("img=jpg:image:float32:imagenet,flip: %+v, %v", opt, err)
	}
	if _, err := ParseField("img=jpg:image:float32:bogus"); err == nil {
		t.Error("a fourth part that is neither a shape nor options was accepted")
	}
}
