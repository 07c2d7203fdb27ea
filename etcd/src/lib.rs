//! dnsplan's fenced store on etcd v3 (`EtcdStore`).
