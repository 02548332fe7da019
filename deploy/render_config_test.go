package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// Where render-config reads the template and writes the configuration.
const (
	renderTemplate = "/etc/phonehome/template/receiver.yaml"
	renderConfig   = "/etc/phonehome/config/receiver.yaml"
)

// runRenderConfig runs the receiver's render-config script (its command,
// with the template and the configuration under root) with /bin/sh, as
// the init container of pod podName runs it with busybox's.
func runRenderConfig(t *testing.T, ic corev1.Container, root, podName string) {
	t.Helper()
	require.Len(t, ic.Command, 3)
	require.Equal(t, []string{"/bin/sh", "-c"}, ic.Command[:2])
	require.Contains(t, ic.Command[2], renderTemplate)
	require.Contains(t, ic.Command[2], renderConfig)
	script := strings.NewReplacer(renderTemplate, filepath.Join(root, renderTemplate), renderConfig, filepath.Join(root, renderConfig)).Replace(ic.Command[2])
	require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, renderConfig)), 0o755))
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"POD_NAME=" + podName, "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// TestRenderConfigEvaluatesRulesOnOrdinalZero: docs/rules.md has one
// replica evaluate the fleet rules, rendered from the pod's ordinal: the
// template's ${RULES_EVALUATE} is true on -0 only (before, only
// ${POD_NAME} was replaced, and a template with rules could not say which
// replica evaluates: every replica did).
func TestRenderConfigEvaluatesRulesOnOrdinalZero(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kubeDir, "receiver", "statefulset.yaml"))
	require.NoError(t, err)
	var sts struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	require.NoError(t, sigsyaml.Unmarshal(b, &sts))
	ics := sts.Spec.Template.Spec.InitContainers
	require.Len(t, ics, 1)
	for pod, evaluate := range map[string]string{
		"phonehome-receiver-0": "true", "phonehome-receiver-1": "false", "phonehome-receiver-10": "false",
	} {
		root := t.TempDir()
		tmpl := filepath.Join(root, renderTemplate)
		require.NoError(t, os.MkdirAll(filepath.Dir(tmpl), 0o755))
		require.NoError(t, os.WriteFile(tmpl, []byte("storage: {external_labels: {replica: ${POD_NAME}}}\nrules: {evaluate: ${RULES_EVALUATE}}\n"), 0o600))
		runRenderConfig(t, ics[0], root, pod)
		got, err := os.ReadFile(filepath.Join(root, renderConfig))
		require.NoError(t, err)
		require.Equal(t, "storage: {external_labels: {replica: "+pod+"}}\nrules: {evaluate: "+evaluate+"}\n", string(got), pod)
	}
}
