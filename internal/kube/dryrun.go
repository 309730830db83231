package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// ErrKindNotServed: the cluster does not serve a kind of the objects, as
// agent-sandbox's where its CustomResourceDefinitions are not installed.
var ErrKindNotServed = errors.New("kind not served")

// DryRun has the API server admit each of objs (in namespace, or in the
// one an object names) by its server-side dry run, with strict field
// validation: nothing is stored. It first asks whether the cluster serves
// every kind, and says which it does not, before sending any object. objs
// are as rendered: a Secret's values are never among them.
func (k *Cluster) DryRun(ctx context.Context, objs []any) error {
	docs := make([][]byte, len(objs))
	heads := make([]kubeapi.Object, len(objs))
	served := map[string]bool{}
	for i, obj := range objs {
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &heads[i]); err != nil {
			return err
		}
		docs[i] = b
		h := heads[i]
		key := h.APIVersion + "/" + h.Kind
		if _, asked := served[key]; asked {
			continue
		}
		ok, err := k.API.Served(ctx, h.APIVersion, h.Kind)
		if err != nil {
			return err
		}
		served[key] = ok
		if !ok {
			return fmt.Errorf("the cluster does not serve %s (%s): its CustomResourceDefinition is not installed: %w", h.Kind, h.APIVersion, ErrKindNotServed)
		}
	}
	for i, b := range docs {
		if _, err := k.API.Create(ctx, k.Namespace, b, kubeapi.CreateOptions{DryRun: true}); err != nil {
			return fmt.Errorf("the API server's dry run refused %s %s: %w", heads[i].Kind, heads[i].Metadata.Name, err)
		}
	}
	return nil
}
