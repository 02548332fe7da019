package configdiff

import (
	"testing"

	"github.com/stretchr/testify/require"
)

type config struct {
	Limits  map[string]int `yaml:"limits"`
	Storage struct {
		Path string `yaml:"path"`
	} `yaml:"storage,omitempty"`
	Peers   []string `yaml:"peers"`
	derived string
	Skipped string `yaml:"-"`
}

func TestSections(t *testing.T) {
	a := config{Limits: map[string]int{"series": 1}, Peers: []string{"a"}, derived: "x", Skipped: "x"}
	b := a
	require.Empty(t, Sections(a, b, nil))

	b.Limits = map[string]int{"series": 2}
	b.Storage.Path = "data"
	b.derived, b.Skipped = "y", "y" // not sections
	require.Equal(t, []string{"limits", "storage"}, Sections(a, b, nil))
	require.Equal(t, []string{"storage"}, Sections(a, b, map[string]bool{"limits": true}))
}
