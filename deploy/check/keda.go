package check

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KEDA's Go API module is the whole operator, with every scaler's
// dependencies: too heavy to import for two types. These are the fields of
// keda.sh/v1alpha1 ScaledObject and TriggerAuthentication (KEDA 2.x) that
// Nudge's manifests may use, with KEDA's JSON names; decoding strictly into
// them rejects a misspelt or misplaced field. A field KEDA has and these
// lack is reported too: add it here (from KEDA's apis/keda/v1alpha1) when a
// manifest needs it.

type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef   scaleTarget     `json:"scaleTargetRef"`
	PollingInterval  *int32          `json:"pollingInterval,omitempty"`
	InitialCooldown  *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod   *int32          `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount *int32          `json:"idleReplicaCount,omitempty"`
	MinReplicaCount  *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount  *int32          `json:"maxReplicaCount,omitempty"`
	Advanced         *advancedConfig `json:"advanced,omitempty"`
	Triggers         []scaleTriggers `json:"triggers"`
	Fallback         *fallback       `json:"fallback,omitempty"`
}

type scaleTarget struct {
	APIVersion             string `json:"apiVersion,omitempty"`
	Kind                   string `json:"kind,omitempty"`
	Name                   string `json:"name"`
	EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
}

type advancedConfig struct {
	HorizontalPodAutoscalerConfig *hpaConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	RestoreToOriginalReplicaCount bool       `json:"restoreToOriginalReplicaCount,omitempty"`
}

type hpaConfig struct {
	Name     string                                         `json:"name,omitempty"`
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

type scaleTriggers struct {
	Type              string                         `json:"type"`
	Name              string                         `json:"name,omitempty"`
	UseCachedMetrics  bool                           `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string              `json:"metadata"`
	AuthenticationRef *authenticationRef             `json:"authenticationRef,omitempty"`
	MetricType        autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type authenticationRef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

type fallback struct {
	FailureThreshold int32 `json:"failureThreshold"`
	Replicas         int32 `json:"replicas"`
}

type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              triggerAuthenticationSpec `json:"spec"`
}

type triggerAuthenticationSpec struct {
	SecretTargetRef []secretTargetRef `json:"secretTargetRef,omitempty"`
	Env             []authEnvironment `json:"env,omitempty"`
}

type secretTargetRef struct {
	Parameter string `json:"parameter"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

type authEnvironment struct {
	Parameter     string `json:"parameter"`
	Name          string `json:"name"`
	ContainerName string `json:"containerName,omitempty"`
}
