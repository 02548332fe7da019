package storage_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
)

// TestExpandExternalLabels: ${NAME} takes the variable's value and $$ is a
// literal $, in external label values only; an unset or empty variable, or a
// $ that starts neither, is an error naming the key and the variable.
func TestExpandExternalLabels(t *testing.T) {
	env := map[string]string{"POD_NAME": "phonehome-receiver-1", "ZONE": "eu-1", "EMPTY": ""}
	lookup := func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
	for _, tc := range []struct {
		name, value, want string
		errs              []string
	}{
		{name: "set", value: "${POD_NAME}", want: "phonehome-receiver-1"},
		{name: "within text", value: "r-${POD_NAME}.${ZONE}", want: "r-phonehome-receiver-1.eu-1"},
		{name: "no reference", value: "receiver-0", want: "receiver-0"},
		{name: "literal dollar", value: "$${POD_NAME}$$", want: "${POD_NAME}$"},
		{name: "unset", value: "${NOT_SET}", errs: []string{"storage.external_labels.replica: ${NOT_SET}: environment variable NOT_SET is not set"}},
		{name: "empty", value: "x${EMPTY}", errs: []string{"storage.external_labels.replica: ${EMPTY}: environment variable EMPTY is empty"}},
		{name: "without braces", value: "$POD_NAME", errs: []string{`storage.external_labels.replica: "$POD_NAME": a $ starts a reference ${NAME}`}},
		{name: "lone dollar", value: "a$", errs: []string{`storage.external_labels.replica: "$": a $ starts`}},
		{name: "unterminated", value: "${POD_NAME", errs: []string{`"${POD_NAME": a $ starts`}},
		{name: "not a name", value: "${1X}", errs: []string{`"${1X}": a $ starts`}},
		{name: "no name", value: "${}", errs: []string{`"${}": a $ starts`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := storage.Config{ExternalLabels: map[string]string{"replica": tc.value, "other": "${ZONE}"}}
			err := c.ExpandExternalLabels(lookup)
			require.Equal(t, "eu-1", c.ExternalLabels["other"], "every label is expanded")
			if tc.errs == nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, c.ExternalLabels["replica"])
				return
			}
			for _, want := range tc.errs {
				require.ErrorContains(t, err, want)
			}
			require.Equal(t, tc.value, c.ExternalLabels["replica"], "left as written")
		})
	}

	// Every problem is reported, by key.
	c := storage.Config{ExternalLabels: map[string]string{"a": "${UNSET_A}", "b": "${EMPTY}"}}
	err := c.ExpandExternalLabels(lookup)
	require.ErrorContains(t, err, "storage.external_labels.a: ${UNSET_A}")
	require.ErrorContains(t, err, "storage.external_labels.b: ${EMPTY}")
}
