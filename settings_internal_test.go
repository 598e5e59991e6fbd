package shardload

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Every knob names a field of Config (and, tuned, of Settings); its flag form reads
// back as it was set, and its limits refuse what they say.
func TestTable(t *testing.T) {
	names := map[string]bool{}
	for _, k := range Knobs {
		if names[k.Name] {
			t.Errorf("%s: defined twice", k.Name)
		}
		names[k.Name] = true
		var cfg Config
		f := reflect.ValueOf(&cfg).Elem().FieldByName(k.Field)
		if !f.IsValid() {
			t.Fatalf("%s: Config has no field %s", k.Name, k.Field)
		}
		if k.Tuned {
			k.Setting(Settings{}) // panics without the field
		}
		v := "true"
		if f.Kind() != reflect.Bool {
			v = "5"
			if k.Bytes {
				v = "3MiB"
			}
		}
		if err := k.Set(&cfg, v); err != nil {
			t.Errorf("%s: %v", k.Name, err)
			continue
		}
		if got := k.Value(&cfg); got != v {
			t.Errorf("%s: set %s, reads back %s", k.Name, v, got)
		}
		if k.Min > 0 {
			if err := k.Set(&cfg, "0"); err == nil || !strings.Contains(err.Error(), "--"+k.Name+" 0: want") {
				t.Errorf("%s 0: %v", k.Name, err)
			}
		}
	}
}

// A hello's member sets its knob, within the knob's limits; shuffle is the negation
// of --no-shuffle, and read_gap 0 means none.
func TestSetHello(t *testing.T) {
	set := func(name, raw string) (Config, error) {
		var cfg Config
		for _, k := range Knobs {
			if k.Hello == name {
				return cfg, k.SetHello(&cfg, json.RawMessage(raw))
			}
		}
		t.Fatalf("no knob has hello member %s", name)
		return cfg, nil
	}
	if cfg, err := set("shuffle", "false"); err != nil || !cfg.NoShuffle {
		t.Errorf("shuffle false: NoShuffle %v, %v", cfg.NoShuffle, err)
	}
	if cfg, err := set("read_gap", "0"); err != nil || cfg.ReadGap != -1 {
		t.Errorf("read_gap 0: ReadGap %d, %v", cfg.ReadGap, err)
	}
	if cfg, err := set("slab_bytes", "4194304"); err != nil || cfg.SlabBytes != 4<<20 {
		t.Errorf("slab_bytes: SlabBytes %d, %v", cfg.SlabBytes, err)
	}
	for _, tc := range []struct{ name, raw, want string }{
		{"slabs", "254", "slabs 254: want 1 to 253"},
		{"open_shards", "-1", "open_shards -1: want 1 to 4096"},
		{"shuffle_buffer", "1.5", "shuffle_buffer: want a whole number"},
		{"count_first", "1", "count_first: want true or false"},
	} {
		if _, err := set(tc.name, tc.raw); err == nil || err.Error() != tc.want && !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s %s: %v, want %q", tc.name, tc.raw, err, tc.want)
		}
	}
}

// Validate holds a library caller to the table's limits, as the command line and a
// trainer's hello are held: above a knob's most, as below its least.
func TestValidateUsesTheTable(t *testing.T) {
	for _, k := range Knobs {
		if k.Max == 0 {
			continue
		}
		var cfg Config
		reflect.ValueOf(&cfg).Elem().FieldByName(k.Field).SetInt(k.Max + 1)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "--"+k.Name) {
			t.Errorf("%s %d: Validate says %v, want it refused naming --%s", k.Field, k.Max+1, err, k.Name)
		}
	}
}
