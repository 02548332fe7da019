package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/phonehome/phonehome/receive"
)

// TestReceiverReplicasShareOneConfig: the pods of every built receiver
// StatefulSet read one ConfigMap, with no init container to tell them apart.
// Loaded by the receiver's own loader with the env each pod gets, the
// configuration gives each replica its pod's name as
// storage.external_labels.replica, and with its commented rules section
// enabled, phonehome-receiver-0 alone evaluates the fleet rules. The file is
// the ConfigMap's, mounted whole: an edit of the ConfigMap in place reaches
// the running pods (a subPath mount is never updated; docs/operations.md).
func TestReceiverReplicasShareOneConfig(t *testing.T) {
	examples := build(t, filepath.Join(kubeDir, "example-secrets"))
	checked := 0
	for _, oc := range ourContainers(t) {
		if oc.binary != "receiver" {
			continue
		}
		requireConfigMountedWhole(t, oc)
		for _, tc := range []struct {
			pod       string
			evaluates bool
		}{{"phonehome-receiver-0", true}, {"phonehome-receiver-1", false}} {
			root := t.TempDir()
			args, env := podFiles(t, root, oc.r, examples, tc.pod, oc.pt, oc.c)
			cfgPath := configFileArg(args)
			require.NotEmpty(t, cfgPath, "%s: no --config.file", oc)
			require.Contains(t, env, "POD_NAME="+tc.pod, "%s", oc)
			setEnv(t, env)
			where := fmt.Sprintf("%s, pod %s", oc, tc.pod)

			cfg, err := receive.LoadConfig(cfgPath)
			require.NoError(t, err, where)
			require.Equal(t, tc.pod, cfg.Storage.ExternalLabels["replica"], where)
			require.False(t, cfg.Rules.Evaluates(), "%s: the shipped configuration has no rules", where)

			enableCommentedRules(t, cfgPath)
			cfg, err = receive.LoadConfig(cfgPath)
			require.NoError(t, err, where)
			require.Equal(t, tc.pod, cfg.Storage.ExternalLabels["replica"], where)
			require.Equal(t, tc.evaluates, cfg.Rules.Evaluates(), where)
		}
		checked++
	}
	require.GreaterOrEqual(t, checked, 2, "dev and production")
}

// enableCommentedRules appends to the configuration at path its commented
// example of the rules section ("#   rules:" and the lines under it).
func enableCommentedRules(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var section []string
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case l == "#   rules:":
			section = append(section, "rules:")
		case section != nil && strings.HasPrefix(l, "#     "):
			section = append(section, strings.TrimPrefix(l, "#   "))
		case section != nil:
			require.Greater(t, len(section), 1, "%s: an empty commented rules section", path)
			require.NoError(t, os.WriteFile(path, []byte(string(b)+strings.Join(section, "\n")+"\n"), 0o600))
			return
		}
	}
	t.Fatalf("%s: no commented rules section (\"#   rules:\")", path)
}

// requireConfigMountedWhole: the --config.file of oc is in a ConfigMap volume
// mounted without subPath.
func requireConfigMountedWhole(t *testing.T, oc ourContainer) {
	t.Helper()
	cfgPath := configFileArg(oc.c.Args)
	i := slices.IndexFunc(oc.c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.MountPath == cfgPath || strings.HasPrefix(cfgPath, strings.TrimSuffix(m.MountPath, "/")+"/")
	})
	require.GreaterOrEqual(t, i, 0, "%s: %q is on no volume", oc, cfgPath)
	m := oc.c.VolumeMounts[i]
	require.Empty(t, m.SubPath, "%s: volume %s mounted with a subPath: an edit of the ConfigMap would not reach the pod", oc, m.Name)
	v := slices.IndexFunc(oc.pt.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
	require.GreaterOrEqual(t, v, 0, "%s: no volume %s", oc, m.Name)
	require.NotNil(t, oc.pt.Spec.Volumes[v].ConfigMap, "%s: %q is not read from a ConfigMap", oc, cfgPath)
}

// setEnv sets a pod's environment (NAME=value, podFiles') in the test's, for
// the receiver's loader; the test's end restores it.
func setEnv(t *testing.T, environ []string) {
	t.Helper()
	for _, e := range environ {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
}
