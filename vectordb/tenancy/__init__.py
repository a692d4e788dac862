"""vectordb.tenancy: multi-tenant access in the disk index (Curator-style tenant trees).

Enabled by ``IndexConfig(tenancy=True)``; used through SpannIndex (``insert(..., tenants=)``,
``grant``, ``revoke``, ``delete_tenant``, ``count``, ``search(..., tenant=)``).
"""

from vectordb.tenancy.tenancy import Tenancy
from vectordb.tenancy.tenant_names import TenantId, check_tenant
from vectordb.tenancy.tenant_rows import tenant_rows

__all__ = ["Tenancy", "TenantId", "check_tenant", "tenant_rows"]
