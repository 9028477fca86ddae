module konn.local/interop

go 1.26.2

require (
	google.golang.org/grpc v1.81.1
	google.golang.org/protobuf v1.36.12
	sigs.k8s.io/apiserver-network-proxy v0.36.0
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.36.0
)

require (
	golang.org/x/net v0.55.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
	golang.org/x/text v0.37.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260226221140-a57be14db171 // indirect
)
